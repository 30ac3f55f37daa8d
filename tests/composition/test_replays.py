"""Minimal step lists of the machine's counterexamples, replayed rule by rule with the
invariants checked after each step: the oracle must accept what the library does there
(the random-seed triage: model bugs fixed in machine.py, library defects N9-N11 of
test_regressions.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import SESSION_ALIASES

from .machine import CompositionMachine, PeerProcess

STEPS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    # a set re-entering a generator's lease still guards plain writes once it is closed (N8)
    "set re-enters a closed generator's lease": [
        ("start_generator", dict(auto_extend=False, name="c", nested=False, skip=False, ttl=0.2)),
        ("enter_many", dict(auto_extend=False, container="list", names=["c"], ttl=0.2)),
        ("close_generator", dict(index=0)),
        ("write_under_context", dict(name="a")),
        ("write_under_context", dict(name="s")),
    ],
    # a name the inner set re-entered is the innermost lease (N8)
    "inner set re-enters a name of the outer set": [
        ("enter_many", dict(auto_extend=False, container="list", names=["a", "b"], ttl=0.2)),
        ("enter_atomic", {}),
        ("enter_many", dict(auto_extend=False, container="list", names=["a"], ttl=0.2)),
        ("write_under_context", dict(name="a")),
    ],
    # N10
    "released long reader, short reader left": [
        ("enter_rw", dict(auto_extend=False, mode="read", ttl=0.2)),
        ("other_thread", dict(mode="read", name="r")),
        ("sleep_past_short_ttls", {}),
    ],
    # N9
    "set re-entered a lease that ran out": [
        ("start_generator", dict(auto_extend=False, name="a", nested=False, skip=False, ttl=0.2)),
        ("enter_many", dict(auto_extend=False, container="list", names=["a"], ttl=0.2)),
        ("sleep_past_short_ttls", {}),
        ("exit_block", dict(raising=False)),
    ],
    # N11
    "generator ends inside the set": [
        ("start_generator", dict(auto_extend=False, name="b", nested=False, skip=False, ttl=30.0)),
        ("enter_many", dict(auto_extend=False, container="list", names=["r", "b"], ttl=30.0)),
        ("advance_generator", dict(index=0)),
        ("advance_generator", dict(index=0)),
        ("advance_generator", dict(index=0)),
        ("exit_block", dict(raising=False)),
        ("start_generator", dict(auto_extend=False, name="b", nested=False, skip=False, ttl=30.0)),
    ],
}


def make(alias: str, peer: PeerProcess) -> CompositionMachine:
    config = SESSION_ALIASES[alias]
    cls = type(
        f"Replay_{alias}",
        (CompositionMachine,),
        {"alias": alias, "urls": config["NODES"], "prefix": config["KEY_PREFIX"], "peer": peer},
    )
    machine: CompositionMachine = cls()
    return machine


def check(m: CompositionMachine) -> None:
    m.one_holder_at_a_time()
    m.open_holders_still_hold()
    m.nothing_left_on_the_nodes()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("alias", ["default", "multi"])
@pytest.mark.parametrize("case", list(STEPS))
def test_the_oracle_accepts_the_replayed_steps(alias: str, case: str, peer: PeerProcess) -> None:
    """Each step list runs clean: no Violation from a rule or an invariant, nor at teardown."""
    machine = make(alias, peer)
    try:
        for rule, kwargs in STEPS[case]:
            getattr(machine, rule)(**kwargs)
            check(machine)
    finally:
        machine.teardown()
