"""Many hosts, one verdict: an agent per host, a c10d TCPStore between them (docs/cluster.md).

- :mod:`wire`: the key names, the authenticated envelope (HMAC-SHA256 with a per-run nonce) and the
  JSON form of what crosses hosts (per-rank activities, a few probe records). Pure.
- :mod:`merge`: the agents' answers → one Job over every host → the same consensus as on one host. Pure.
- :mod:`store`: torch.distributed's TCPStore with a timeout on every exchange (imports torch).
- :mod:`agent`: ``scout-sys agent``; :mod:`beat`: what its heartbeats say of each rank (the watch's
  own parts); :mod:`client`: ``diagnose --cluster``; :mod:`watch`: ``watch --cluster``.
"""
