"""Replay workers (silent-data-corruption tests run beside the live job, one per device) and
checkpoint certification.

Not built yet: no open issue asks for it. When it comes, it runs outside the monitor process (only
these workers import torch) and reports signatures back to ``consensus/c3``.
"""
