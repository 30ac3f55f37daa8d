"""``python -m django_redlock.testing serve``: run nodes on loopback until interrupted."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType

from django_redlock.testing.nodes import RedisNodeError, RedisNodes
from django_redlock.testing.server import RedisServerNotFound


def _parse_ports(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ports: {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``serve``: start nodes, print their URLs, run until SIGTERM/SIGINT (or stdin EOF)."""
    parser = argparse.ArgumentParser(prog="python -m django_redlock.testing")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run redis nodes on loopback until interrupted")
    serve.add_argument("--count", type=int, default=3)
    serve.add_argument("--ports", type=_parse_ports, help="e.g. 7001,7002,7003 (default: free)")
    serve.add_argument("--unix", action="store_true", help="unix sockets instead of TCP")
    serve.add_argument("--persistence", choices=["aof", "rdb"])
    serve.add_argument(
        "--watch-stdin", action="store_true", help="also stop when stdin reaches EOF"
    )
    args = parser.parse_args(argv)

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    count = len(args.ports) if args.ports else args.count
    try:
        nodes = RedisNodes.start(
            count, unix=args.unix, persistence=args.persistence, ports=args.ports
        )
    except (RedisNodeError, RedisServerNotFound) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    with nodes:
        for node in nodes:
            print(f"node {node.url} pid={node.pid}", flush=True)
        print(f"REDLOCK_NODES={','.join(nodes.urls)}", flush=True)
        try:
            if args.watch_stdin:
                sys.stdin.buffer.read()
            else:
                while all(node.is_running for node in nodes):
                    time.sleep(0.5)
                print("error: a node exited on its own", file=sys.stderr)
                return 1
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
