"""``p99_band_break``: a pair's P99 jumps against its own trailing baseline while its P50
holds, and the statistics that decide it (median moves, binomial tails)."""

from __future__ import annotations

import math

import numpy as np

from ...models import sketch
from ...core.findings import Finding, Subject
from .frames import NS_MIN, Frames, Thresholds, _clip_window, _ms, _reportable, finding
from .hints import HINTS
from .pairs import _pair_flats, _pair_minute_matrices, _pair_minute_matrix, _pair_rows_histogram, _pair_series
from .sketches import COARSE, _coarse_bin_of, _cumulative_quantile


#: Minutes of trailing baselines and blocks compared at once: a week's ~10,000 at once held
#: ~140 MB of (minutes x bins) arrays a pair.
BAND_CHUNK_MINUTES = 1440
#: Minutes of the pair's own data (minutes with at least one call of the pair) its trailing
#: baseline must hold before a break can start (docs/design.md: at least 30), whatever the window
#: asked: the look-back before a window, or before the data began, holds no data, and a
#: baseline of two minutes made a heavy tail look like a break.
BAND_BASELINE_DATA_MINUTES = 30
#: A break ends before this many consecutive calm blocks (``block_minutes`` each: 10
#: minutes by default) with the P99 back under the exit threshold; its end is the last
#: minute with a call past that threshold before them.
BAND_CALM_BLOCKS = 2
#: Calls past a threshold count only when they are more than the frozen baseline's own
#: share of them explains (``_excess_p`` at most this): to start a break (strict: every
#: minute starts a new comparison, and a heavy tail puts a few calls past twice its P99 in
#: any block) and to keep one going (lenient: a weak break's blocks carry a few calls each;
#: over a heavy tail, a block of a hundred calls has its P99 past 1.4 x the baseline's one
#: time in four by chance alone).
BAND_ENTRY_P = 1e-4
BAND_HOT_P = 0.05


def _band_stats(prefix: np.ndarray, ts: np.ndarray, B: int, W: int, first_bin: int = 0, tolerance: float = 0.25):
    """For each minute in ``ts``: calls and coarse P50/P99 of its trailing ``B`` minutes and of
    its next ``W``, and whether the next ``W``'s median moved past ``tolerance`` of the
    trailing one (``_median_moved``), a day of minutes at a time. ``prefix``: the minutes x
    bins matrix summed over both axes (row m, column j: the calls of minutes before m in bins
    up to j; its first column coarse bin ``first_bin``), so a span of minutes' running sums
    over the bins are one subtraction (a cumulative sum per quantile was half the detector's
    time)."""
    parts = []
    for lo in range(0, len(ts), BAND_CHUNK_MINUTES):
        t = ts[lo:lo + BAND_CHUNK_MINUTES]
        base = prefix[t] - prefix[t - B]
        win = prefix[t + W] - prefix[t]
        b50 = _cumulative_quantile(base, 0.5, first_bin)
        # The block's calls at or under (1 + tolerance) x the baseline median, and at or over
        # (1 - tolerance) x it (coarse bins).
        ref = np.where(np.isfinite(b50), b50, 1.0)
        rows, last = np.arange(len(t)), win.shape[1] - 1
        hi_col = sketch.keys_of(ref * (1 + tolerance)) // COARSE - first_bin
        lo_col = sketch.keys_of(ref * (1 - tolerance)) // COARSE - first_bin
        under = np.where(hi_col < 0, 0, win[rows, np.clip(hi_col, 0, last)])
        over = win[:, -1] - np.where(lo_col <= 0, 0, win[rows, np.clip(lo_col - 1, 0, last)])
        parts.append((base[:, -1], win[:, -1], b50, _cumulative_quantile(base, 0.99, first_bin),
                      _cumulative_quantile(win, 0.99, first_bin), _median_moved(win[:, -1], under, over)))
    return tuple(np.concatenate(col) for col in zip(*parts))


#: Standard errors a median's move must clear (``_median_moved``).
BAND_MEDIAN_Z = 3.0


def _median_moved(calls, under, over):
    """Whether a median moved past a tolerance around a reference, beyond sampling noise:
    fewer than half of ``calls`` at or under the upper bound (``under``), or at or over the
    lower one (``over``), by ``BAND_MEDIAN_Z`` standard errors. Over a heavy tail a few
    hundred calls' median wanders by more than the tolerance (sigma 1.6, 400 calls: 10 %
    one standard error); only a move the calls show for sure is a shift."""
    calls = np.asarray(calls, dtype=float)
    floor = calls / 2 - BAND_MEDIAN_Z * np.sqrt(calls) / 2
    return (np.asarray(under) < floor) | (np.asarray(over) < floor)


def _histogram_median_moved(h: sketch.Histogram, ref: float, tolerance: float) -> bool:
    """``_median_moved`` of a histogram's calls against ``ref`` (ns) +- ``tolerance``."""
    cum = np.cumsum(h.counts)
    under = cum[sketch.key_of(ref * (1 + tolerance))]
    k_lo = sketch.key_of(ref * (1 - tolerance))
    over = cum[-1] - (cum[k_lo - 1] if k_lo > 0 else 0)
    return bool(_median_moved(cum[-1], under, over))


def _binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    lp, lq, lg = math.log(p), math.log1p(-p), math.lgamma(n + 1)

    def term(i: int) -> float:
        return math.exp(lg - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)

    if k <= n * p:  # (a large tail: one minus the head)
        return max(0.0, 1.0 - sum(term(i) for i in range(k)))
    total = 0.0
    for i in range(k, n + 1):  # (terms fall past the mode: stop once they no longer count)
        t = term(i)
        total += t
        if t < 1e-15 * total:
            break
    return min(1.0, total)


def _excess_p(k: int, n: int, k0: int, n0: int) -> float:
    """How likely ``k`` or more of a block's ``n`` calls lie past a threshold when ``k0`` of
    its baseline's ``n0`` did, both at one rate: the conditional test of two Poisson counts
    (given the ``k + k0`` calls past it, each is the block's with chance ``n / (n + n0)``).
    The baseline's count is itself a sample: over a heavy tail it is a handful, and taking
    it for the rate made ordinary blocks look like breaks."""
    if n <= 0:
        return 1.0
    return _binomial_tail(k, k + k0, n / (n + n0))


def _p99_past(calls: int, past: int) -> bool:
    """Whether the P99 of ``calls`` calls reaches a threshold ``past`` of them exceed: at
    least 1 % of them past it."""
    return calls > 0 and past >= 0.01 * calls


def detect_p99_band_break(frames: Frames, th: Thresholds) -> list[Finding]:
    """``p99_band_break``: a pair's P99 jumps against its own trailing baseline while P50 holds.

    For every minute t whose trailing baseline ``[t - baseline_minutes, t)`` holds at least
    ``BAND_BASELINE_DATA_MINUTES`` minutes with calls of the pair (so the first 30 minutes
    of a pair's data never hold a break, whatever window was asked), the next
    ``block_minutes`` are compared with it: it fires when the block's P99 is at least
    ``band_ratio`` x the baseline P99, its P50 has not moved past ``band_p50_tolerance``
    of the baseline P50 (beyond sampling noise, ``_median_moved``), both have
    ``min_samples`` calls, and at least ``band_min_outliers`` calls lie past
    ``band_ratio`` x baseline P99 — more than the baseline's own share of such calls
    explains (``_excess_p`` at most ``BAND_ENTRY_P``).

    The baseline is then frozen, and the break is followed block by block from t. The exit
    threshold is lower than the entry one, sqrt(``band_ratio``) x the baseline P99 (a
    hysteresis: a heavy tail's noisy P99 neither ends a break at once nor holds it open): a
    block is hot while at least 1 % of its calls lie past it (its P99 reaches it) and more
    than the baseline's share explains (``BAND_HOT_P``). The break ends before the first
    ``BAND_CALM_BLOCKS`` calm blocks in a row (or the data's end); the hot blocks just
    before t belong to it too. Its window runs from its first call past a threshold to its
    last call past the exit threshold before the calm blocks, and over that whole window the
    P50 must still hold.
    """
    out = []
    B, W = max(30, th.baseline_minutes), max(1, th.block_minutes)
    first, n = frames.first_minute, frames.end_minute - frames.first_minute
    if n < B + W:
        return []
    exit_ratio = math.sqrt(max(th.band_ratio, 1.0))
    minute_mats = _pair_minute_matrices(frames)
    for (caller, callee), df in _pair_series(frames).items():
        mat = (minute_mats[(caller, callee)] if minute_mats is not None
               else _pair_minute_matrix(frames, df, _pair_flats(frames)[(caller, callee)]))
        minutes = df["minute"].to_numpy()
        # Only the bins the pair's calls fall in (a pair's latencies span a few dozen of the
        # 256): the sums and quantiles below are the same, over a fraction of the columns.
        used = np.flatnonzero(mat.any(axis=0))
        ts = np.arange(B, n - W + 1)
        if not len(ts) or not len(used):
            continue
        lo_bin, hi_bin = int(used[0]), int(used[-1]) + 1
        prefix = np.zeros((n + 1, hi_bin - lo_bin), dtype=np.int64)
        np.cumsum(mat[:, lo_bin:hi_bin], axis=0, dtype=np.int64, out=prefix[1:])
        np.cumsum(prefix, axis=1, out=prefix)
        calls = np.diff(prefix[:, -1])  # calls a minute
        data_minutes = np.concatenate([[0], np.cumsum(calls > 0)])  # minutes with calls, before each
        earliest = int(np.searchsorted(data_minutes, BAND_BASELINE_DATA_MINUTES))  # no break before
        nb, nw, b50, b99, w99, moved = _band_stats(prefix, ts, B, W, lo_bin, th.band_p50_tolerance)
        with np.errstate(invalid="ignore", divide="ignore"):
            cand = ((nb >= th.min_samples) & (nw >= th.min_samples) & (w99 >= th.band_ratio * b99)
                    & ~moved
                    & (data_minutes[ts] - data_minutes[ts - B] >= BAND_BASELINE_DATA_MINUTES))
        i = done = 0
        idx = np.flatnonzero(cand)
        while i < len(idx):
            k = idx[i]
            t = int(ts[k])
            thr_ns = th.band_ratio * b99[k]
            thr_bin = _coarse_bin_of(thr_ns)
            ex = mat[:, thr_bin + 1:].sum(axis=1)
            n_ex = int(ex[t:t + W].sum())
            if n_ex < th.band_min_outliers or \
                    _excess_p(n_ex, int(nw[k]), int(ex[t - B:t].sum()), int(nb[k])) > BAND_ENTRY_P:
                i += 1
                continue
            exit_bin = _coarse_bin_of(exit_ratio * b99[k])
            past = mat[:, exit_bin + 1:].sum(axis=1)
            k0 = int(past[t - B:t].sum())

            def hot(a: int, b: int) -> bool:  # minutes [a, b) still show the break
                c, p = int(calls[a:b].sum()), int(past[a:b].sum())
                return _p99_past(c, p) and _excess_p(p, c, k0, int(nb[k])) <= BAND_HOT_P

            # The evidence comes a block after a weak break began: the blocks just before
            # that still show it belong to it (not before the previous break's end, nor
            # inside the pair's first BAND_BASELINE_DATA_MINUTES).
            begin = t
            while begin - W >= max(done, t - B, earliest) and hot(begin - W, begin):
                begin -= W
            start = min(t + int(np.flatnonzero(ex[t:t + W])[0]),
                        begin + int(np.flatnonzero(past[begin:t + W])[0]))
            # Follow the break a block at a time: it ends before the first BAND_CALM_BLOCKS
            # calm blocks in a row, at its last slow call before them.
            stop, calm = n, 0
            for j in range(t + W, n, W):
                if hot(j, j + W):
                    stop, calm = n, 0
                else:
                    stop, calm = (j if not calm else stop), calm + 1
                    if calm >= BAND_CALM_BLOCKS:
                        break
            slow = np.flatnonzero(past[start:stop])
            last = start + int(slow[-1]) if len(slow) else start
            done = last + 1
            s_min, e_min = first + start, first + last + 1
            ratio = None
            if _reportable(frames, s_min, e_min):
                inside = (minutes >= s_min) & (minutes < e_min)
                before = (minutes >= first + t - B) & (minutes < first + t)
                hi = _pair_rows_histogram(frames, df, inside)
                hb = _pair_rows_histogram(frames, df, before)
                o99, o50, r99, r50 = hi.quantile(0.99), hi.quantile(0.5), hb.quantile(0.99), hb.quantile(0.5)
                ratio = (o99 / r99) if (o99 and r99) else None
                if not (o50 and r50) or _histogram_median_moved(hi, r50, th.band_p50_tolerance):
                    ratio = None  # over the whole break the P50 moved too: a shift, not a band
            if _reportable(frames, s_min, e_min) and ratio is not None:
                sev = "critical" if ratio is not None and ratio >= 2 * th.band_ratio else "warning"
                s_ns, e_ns = _clip_window(frames, s_min * NS_MIN, e_min * NS_MIN)
                out.append(finding("p99_band_break", sev, Subject(caller=caller, callee=callee), s_ns, e_ns, {
                    "p99_ms": _ms(o99), "baseline_p99_ms": _ms(r99), "p50_ms": _ms(o50), "baseline_p50_ms": _ms(r50),
                    "ratio": round(ratio, 3) if ratio else None, "threshold_ratio": th.band_ratio,
                    "threshold_ms": _ms(thr_ns), "exit_threshold_ms": _ms(exit_ratio * b99[k]),
                    "outliers": int(ex[start:last + 1].sum()),
                    "baseline_minutes": B, "baseline_data_minutes": int(data_minutes[t] - data_minutes[t - B]),
                    "sample_count": int(hi.count), "baseline_count": int(hb.count),
                }, HINTS["p99_band_break"]))
            nxt = last + 1
            while i < len(idx) and ts[idx[i]] < nxt:
                i += 1
    return out
