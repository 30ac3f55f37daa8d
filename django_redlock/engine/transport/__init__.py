"""How plans' requests reach the nodes: pipelined calls on raw sockets, one deadline for all.

``base`` holds what both drivers share (reconnection backoff, the per-link queue of unread
replies, turning a request into per-node slots); ``sync`` and ``aio`` are the blocking and the
asyncio transports; ``blpop`` blocks waiters until a release wakes them; ``redis_py`` is the
only module that touches redis-py's internals (the handshake and the socket it leaves open).
"""
