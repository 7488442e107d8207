"""Compiled byte-level hot path of pyengine.

``frames`` splits and builds Pulsar wire frames, ``batch`` splits and builds batch payloads and
``poskeys`` packs (ledger, entry) positions into order-preserving LMDB keys. The modules depend on
nothing in ``pyengine``; their Python surface is described by the ``.pyi`` stubs beside them.
"""
