"""Redis ACL users for the tests that run django-redlock with least privilege."""

from __future__ import annotations

from django_redlock.testing import RedisNodes

#: The commands an ACL user of django-redlock needs (docs/algorithm.md repeats this list).
ACL_COMMANDS = (
    "+@connection +info +evalsha +eval +script|load +scan +blpop +rpush "
    "+get +set +del +exists +pttl +pexpire +hget +hmget +hset +hincrby +hexists "
    "+hsetnx +hlen +hgetall "
    "+time +zadd +zrem +zremrangebyscore +zcount +zcard +zrange +zscore +llen +decr"
)


def acl_user_urls(
    nodes: RedisNodes, user: str, password: str, prefix: str, commands: str = ACL_COMMANDS
) -> list[str]:
    """Create ``user`` on every node, confined to keys under ``prefix``, no pub/sub channels
    and ``commands``; returns the nodes' URLs with its credentials."""
    for node in nodes:
        node.client().execute_command(
            "ACL", "SETUSER", user, "on", f">{password}", f"~{prefix}*", "resetchannels",
            *commands.split(),
        )  # fmt: skip
    return [url.replace("redis://", f"redis://{user}:{password}@") for url in nodes.urls]
