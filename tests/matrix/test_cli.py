"""The command line: its command table, the parser built from it, the dispatch to each handler
and the exit status of a wrong command line, a failure or an interrupt."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fallback_matrix import cli
from fallback_matrix.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CellError,
    MatrixError,
)

# The commands CI, the noxfile and the docs call, with what each needs on its command line.
REQUIRED_ARGUMENTS = {
    "list": [],
    "run": ["cpu"],
    "reproduce": ["cpu"],
    "summary": [],
    "project-tests": [],
    "models": [],
    "test-wheel": ["cpu", "--wheel", "dist"],
    "cross": ["cross-cpu-on-cuda"],
    "tooling-tests": [],
    "dist": ["cuda"],
    "publish-local": [],
    "workflows": [],
    "clean": [],
}
RUNNERS = {
    "list": "auto",
    "run": "auto",
    "reproduce": "docker",
    "project-tests": "local",
    "models": "auto",
    "test-wheel": "docker",
    "cross": "docker",
    "publish-local": "docker",
}


def test_the_table_holds_every_command_in_the_order_help_lists_them() -> None:
    assert list(cli.COMMANDS) == list(REQUIRED_ARGUMENTS)
    parser = cli.build_parser()
    usage = parser.format_help()
    positions = [usage.index(f"\n    {name}") for name in cli.COMMANDS]
    assert positions == sorted(positions)
    for name, command in cli.COMMANDS.items():
        assert command.help and command.help in " ".join(usage.split()), name


@pytest.fixture
def matrix_args(write_matrix: Callable[[Any], Path], matrix_data: dict[str, Any]) -> list[str]:
    return ["--matrix", str(write_matrix(matrix_data))]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, cli.Context]]:
    """Every handler of the table replaced by one that records its command and Context."""
    seen: list[tuple[str, cli.Context]] = []
    for name, command in cli.COMMANDS.items():

        def record(c: cli.Context, name: str = name) -> int:
            seen.append((name, c))
            return EXIT_OK

        monkeypatch.setitem(cli.COMMANDS, name, dataclasses.replace(command, handler=record))
    return seen


@pytest.mark.parametrize("name", list(REQUIRED_ARGUMENTS))
def test_each_command_reaches_its_handler_with_its_defaults(
    name: str, matrix_args: list[str], calls: list[tuple[str, cli.Context]]
) -> None:
    assert cli.main([*matrix_args, name, *REQUIRED_ARGUMENTS[name]]) == EXIT_OK
    ((called, context),) = calls
    assert called == name and context.args.command == name
    assert getattr(context.args, "runner", None) == RUNNERS.get(name)
    args = context.args
    assert (args.gpus, args.index_url, args.cache_cap) == (False, None, None)


def test_the_table_names_the_handlers_of_every_module() -> None:
    handlers = {name: command.handler.__name__ for name, command in cli.COMMANDS.items()}
    assert handlers == {name: f"cmd_{name.replace('-', '_')}" for name in REQUIRED_ARGUMENTS}
    modules = {name: command.handler.__module__ for name, command in cli.COMMANDS.items()}
    assert modules["dist"] == modules["publish-local"] == "fallback_matrix.release"
    assert modules["clean"] == "fallback_matrix.clean"


def test_arguments_keep_their_defaults_and_actions() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["dist", "cuda", "cpu"])
    assert (args.cells, args.out, args.tag) == (["cuda", "cpu"], "dist", None)
    args = parser.parse_args(["publish-local", "--cell", "cpu", "--cell", "cuda-on-py312"])
    assert args.cell == ["cpu", "cuda-on-py312"]
    args = parser.parse_args(["test-wheel", "cpu", "--wheel", "w", "--as", "cpu-again"])
    assert (args.cell, args.wheel, args.name) == ("cpu", "w", "cpu-again")
    args = parser.parse_args(["run", "cpu", "--index-url", "cpu=https://a", "--gpus"])
    assert (args.index_url, args.gpus, args.runner) == (["cpu=https://a"], True, "auto")
    args = parser.parse_args(["workflows", "--check", "--artifacts", "out"])
    assert (args.check, args.artifacts) == (True, "out")
    assert parser.parse_args(["clean", "--caches"]).caches is True


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nope"], "argument COMMAND: invalid choice: 'nope'"),
        (["run"], "the following arguments are required: cells"),
        (["run", "cpu", "--runner", "podman"], "argument --runner: invalid choice: 'podman'"),
        (["test-wheel", "cpu"], "the following arguments are required: --wheel"),
        (["clean", "--bogus"], "unrecognized arguments: --bogus"),
        (["summary", "--runner", "local"], "unrecognized arguments: --runner local"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_a_wrong_command_line_exits_2_saying_what_is_wrong(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == EXIT_USAGE
    error = capsys.readouterr().err
    assert error.startswith("usage: python -m fallback_matrix")
    assert message in error


@pytest.mark.parametrize("name", list(REQUIRED_ARGUMENTS))
def test_every_command_has_its_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([name, "--help"])
    assert exited.value.code == EXIT_OK
    shown = capsys.readouterr().out
    assert shown.startswith(f"usage: python -m fallback_matrix {name} ")
    assert "--artifacts DIR" in shown
    if name in RUNNERS:
        assert f"(default {RUNNERS[name]};" in " ".join(shown.split())
    else:
        assert "--runner" not in shown


@pytest.mark.parametrize(
    ("raised", "status", "said"),
    [
        (MatrixError("no such thing"), EXIT_USAGE, "error: no such thing"),
        (CellError("cell cpu: broken"), EXIT_FAILED, "error: cell cpu: broken"),
        (KeyboardInterrupt(), EXIT_INTERRUPTED, "error: interrupted"),
    ],
)
def test_a_failure_ends_with_its_exit_status_and_message(
    raised: BaseException,
    status: int,
    said: str,
    matrix_args: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def fail(c: cli.Context) -> int:
        raise raised

    command = dataclasses.replace(cli.COMMANDS["list"], handler=fail)
    monkeypatch.setitem(cli.COMMANDS, "list", command)
    assert cli.main([*matrix_args, "list"]) == status
    assert said in capsys.readouterr().out


def test_a_check_that_fails_exits_1(
    matrix_args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    command = dataclasses.replace(cli.COMMANDS["list"], handler=lambda c: EXIT_FAILED)
    monkeypatch.setitem(cli.COMMANDS, "list", command)
    assert cli.main([*matrix_args, "list"]) == EXIT_FAILED
