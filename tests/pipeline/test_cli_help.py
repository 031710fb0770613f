"""Every `trtpipe` subcommand's --help says what it does: its one-line help from the parent's list, as a
description (argparse shows a subcommand's ``help`` only in the parent's list)."""

from __future__ import annotations

import argparse

from pipeline.cli import make_parser


def _verbs(parser: argparse.ArgumentParser, path=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sp in action.choices.items():
                yield (*path, name), sp
                yield from _verbs(sp, (*path, name))


def test_every_subcommand_help_describes_it():
    verbs = dict(_verbs(make_parser()))
    assert {("serve",), ("stop",), ("status",), ("loadtest", "run"), ("cache", "clean")} <= set(verbs)
    missing = [" ".join(path) for path, sp in verbs.items() if not (sp.description or "").strip()]
    assert not missing, f"no description in --help: {missing}"
    assert verbs[("stop",)].format_help().count("Stop a server started with serve --detach.") == 1
