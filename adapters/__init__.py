"""Adapters: a real serving engine's own code, driven as implementations of our targets.

``kernels/`` holds attnfuzz's own re-creations; everything under ``adapters/``
is *the engine under test*. An adapter turns a :class:`~attnfuzz.reference.batch.Case`
into the engine's own objects, calls the engine's functions unchanged, and
hands what they return to the same oracle. One folder per engine, one file per
target inside it.
"""
