"""Measuring: lane processes that time batches (`lane`, with `timer`, the one batch timer), what
a run is asked to do (`config`), the session's lanes (`runner`) and the run on them that writes
the store (`coordinator`, keeping rows while another process holds the store: `unwritten`), a
failure's one-line cause (`causes`), the consumers that eat batches, the hardware samplers
(`samplers/`, `recorder`), torchrun ranks (`distributed`), a user's own loop (`watch`) and the
pipelines alone (`bench`). Imports `probe.store` to record; never judges or presents.
"""
