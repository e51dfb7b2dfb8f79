"""The core types every layer shares and none of them owns: the span record and its codes,
the series kinds, the time window, findings and incidents. Nothing here imports the rest of
modalscope."""
