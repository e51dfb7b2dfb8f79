"""A local stand-in of the Gemini REST API (generativelanguage v1beta), for offline tests.

The real ``google-genai`` client talks to it when pointed at its URL::

    with GeminiStandin() as api:
        client = genai.Client(api_key="dummy", http_options={"base_url": api.url})
        client.models.generate_content(model="gemini-2.5-flash", contents="hi")

It answers ``POST /v1beta/models/{model}:generateContent``, ``:streamGenerateContent``
(``?alt=sse``, as the client asks), ``:embedContent`` and ``:batchEmbedContents`` with the
JSON shapes the service sends, including ``usageMetadata`` with ``promptTokensDetails`` per
modality, counted from the request the way Gemini bills media: 258 tokens an image,
32 tokens a second of audio (16 kHz 16-bit mono WAV: one token a kilobyte), 263 tokens a
video part, a token for four characters of text. Any other ``GET`` answers 200 with a small
JSON body, so it also serves as a plain, uninstrumented HTTP callee. Every request is kept
in ``requests`` (method, path, headers, parsed body) for assertions.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

IMAGE_TOKENS = 258
VIDEO_TOKENS = 263
AUDIO_BYTES_PER_TOKEN = 1000

_MODEL_PATH = re.compile(r"^/v1beta/models/([^/:]+):([A-Za-z]+)$")


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


def _media_tokens(part: dict[str, Any]) -> tuple[str, int] | None:
    """(MODALITY, tokens) of one media part of a request, or None for text and the rest."""
    blob = part.get("inlineData") or part.get("inline_data")
    ref = part.get("fileData") or part.get("file_data")
    data = blob or ref
    if not isinstance(data, dict):
        return None
    mime = str(data.get("mimeType") or data.get("mime_type") or "")
    kind = mime.split("/", 1)[0]
    if kind == "image":
        return "IMAGE", IMAGE_TOKENS
    if kind == "video":
        return "VIDEO", VIDEO_TOKENS
    if kind == "audio":
        size = 32_000
        if blob is not None:
            try:
                size = len(base64.b64decode(str(blob.get("data") or ""), validate=False))
            except ValueError:
                size = 0
        return "AUDIO", max(1, size // AUDIO_BYTES_PER_TOKEN)
    return None


def prompt_token_details(contents: Any) -> dict[str, int]:
    """Input tokens per modality (TEXT, IMAGE, AUDIO, VIDEO) of a request's contents."""
    counts: dict[str, int] = {}
    if isinstance(contents, dict):
        contents = [contents]
    for content in contents if isinstance(contents, list) else []:
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if not isinstance(part, dict):
                continue
            text = part.get("text")
            if isinstance(text, str):
                counts["TEXT"] = counts.get("TEXT", 0) + max(1, len(text) // 4)
                continue
            media = _media_tokens(part)
            if media is not None:
                counts[media[0]] = counts.get(media[0], 0) + media[1]
    return counts


def _usage(details: dict[str, int], output_tokens: int) -> dict[str, Any]:
    prompt = sum(details.values())
    return {
        "promptTokenCount": prompt,
        "candidatesTokenCount": output_tokens,
        "totalTokenCount": prompt + output_tokens,
        "promptTokensDetails": [
            {"modality": modality, "tokenCount": n} for modality, n in details.items()
        ],
        "candidatesTokensDetails": [{"modality": "TEXT", "tokenCount": output_tokens}],
    }


class GeminiStandin:
    """The stand-in server, on 127.0.0.1 at an ephemeral port, in a daemon thread."""

    def __init__(self, reply_text: str = "A cat sitting on a red sofa.") -> None:
        self.reply_text = reply_text
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet under pytest
                return

            def do_GET(self) -> None:
                standin._record(self, None)
                self._send(200, {"status": "ok", "path": urlsplit(self.path).path})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    standin._record(self, raw)
                    self._error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
                    return
                standin._record(self, body)
                match = _MODEL_PATH.match(urlsplit(self.path).path)
                if match is None or not isinstance(body, dict):
                    self._error(404, "NOT_FOUND", f"Method not found: {self.path}")
                    return
                model, method = match.groups()
                if method == "generateContent":
                    self._send(200, standin._generate(model, body))
                elif method == "streamGenerateContent":
                    self._stream(standin._stream_chunks(model, body))
                elif method == "embedContent":
                    single = standin._embed([body])
                    single["embedding"] = single.pop("embeddings")[0]
                    self._send(200, single)
                elif method == "batchEmbedContents":
                    requests = body.get("requests")
                    self._send(200, standin._embed(requests if isinstance(requests, list) else []))
                else:
                    self._error(404, "NOT_FOUND", f"Method not found: {method}")

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, chunks: list[dict[str, Any]]) -> None:
                data = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, code: int, status: str, message: str) -> None:
                self._send(code, {"error": {"code": code, "message": message, "status": status}})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # a short poll so shutdown() returns at once (the default waits up to 0.5 s)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def __enter__(self) -> "GeminiStandin":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # -- answers ----------------------------------------------------------------------

    def _record(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        seen = Seen(handler.command, handler.path, {k.lower(): v for k, v in handler.headers.items()}, body)
        with self._lock:
            self.requests.append(seen)

    def _candidate(self, text: str, finish: bool = True) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}
        if finish:
            candidate["finishReason"] = "STOP"
        return candidate

    def _generate(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        output_tokens = max(1, len(self.reply_text) // 4)
        return {
            "candidates": [self._candidate(self.reply_text)],
            "usageMetadata": _usage(prompt_token_details(body.get("contents")), output_tokens),
            "modelVersion": f"{model}-001",
            "responseId": f"standin-{len(self.requests)}",
        }

    def _stream_chunks(self, model: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        words = self.reply_text.split(" ")
        half = max(1, len(words) // 2)
        first, rest = " ".join(words[:half]), " " + " ".join(words[half:])
        final = self._generate(model, body)
        final["candidates"] = [self._candidate(rest)]
        return [
            {"candidates": [self._candidate(first, finish=False)], "modelVersion": f"{model}-001"},
            final,
        ]

    def _embed(self, requests: list[Any]) -> dict[str, Any]:
        prompt = 0
        for request in requests:
            content = request.get("content") if isinstance(request, dict) else None
            prompt += sum(prompt_token_details(content).values())
        return {
            "embeddings": [{"values": [0.1 * (i + 1)] * 8} for i in range(max(1, len(requests)))],
            "usageMetadata": {"promptTokenCount": prompt, "totalTokenCount": prompt},
        }
