"""Every command the documents name exists as written: no flag, subcommand, target or file that
is not there (issue 45: the README named a `custom_train:main` and a `jobs submit --resume`
that did not exist).

The commands are taken from the documents themselves, whatever they say today: each line of a
shell code block, and each inline code span that starts with one of our programs. Each is
parsed by the very parser the program uses (``python -m jobs``, ``cluster``, ``train``,
``bench``, the ``slurm-train`` console command), ``make`` targets are looked up in the
Makefile, scripts and spec files on the disk. The commands that need no cluster and change
nothing (``--dry-run``) are also run for real by tests/unit/spec and tests/unit/jobs.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    "README.md",
    "ARCHITECTURE.md",
    "sbatch_templates/README.md",
    "bench/README.md",
    *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")),
]
_FENCE = re.compile(r"^```(\w*)\s*$")
_SPAN = re.compile(r"`([^`\n]+)`")
_PROGRAMS = re.compile(
    r"^(?:\.venv/bin/)?(?:python3? (?:-P )?-m (?:jobs|cluster|train|bench)\b|slurm-train\b|make "
    r"[a-z]|sbatch sbatch_templates/)"
)
# placeholders the documents use for what the reader fills in
_PLACEHOLDER = re.compile(r"\[|\]|\||\.\.\.|<|>|\$\(|`")


def _commands(doc: str) -> Iterator[tuple[str, int, str, bool]]:
    """(document, line, command, whole) for each command named in ``doc``: ``whole`` for a
    command line of a shell block (run as it is), not for a mention in the text (a program
    and its options named, what it needs left out; a span may go on over a line break)."""
    lines = (REPO / doc).read_text(encoding="utf-8").splitlines()
    block: str | None = None  # inside a code block: its language
    text: list[tuple[int, str]] = []  # the paragraph so far: a span may cross a line break

    def mentions() -> Iterator[tuple[str, int, str, bool]]:
        joined = " ".join(t for _, t in text)
        for match in _SPAN.finditer(joined):
            span = " ".join(match.group(1).split())
            if _PROGRAMS.match(span) and not _PLACEHOLDER.search(span):
                yield doc, text[0][0], span, False
        text.clear()

    for number, raw in enumerate(lines, 1):
        fence = _FENCE.match(raw.strip())
        if fence:
            yield from mentions()
            block = None if block is not None else fence.group(1)
            continue
        if block is None:
            if raw.strip():
                text.append((number, raw.strip()))
            else:
                yield from mentions()
            continue
        if block not in ("bash", "sh", "console", "shell", ""):
            continue
        line = raw.strip().removeprefix("$ ")
        line = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
        for part in re.split(r"\s*(?:&&|;|\|\|?)\s*", line):  # a pipe's commands one by one
            part = re.sub(r"^(?:[A-Z_]+=\S*\s+)+", "", part.strip())  # VAR=x cmd
            part = re.sub(r'^eval "\$\((.*)\)"$', r"\1", part)  # eval "$(cmd)": cmd
            if _PROGRAMS.match(part) and not _PLACEHOLDER.search(part):
                yield doc, number, part, True
    yield from mentions()


def _all() -> list[tuple[str, int, str, bool]]:
    return [c for doc in DOCS if (REPO / doc).exists() for c in _commands(doc)]


def _parser(module: str) -> argparse.ArgumentParser:
    mod = importlib.import_module(f"{module}.cli" if module != "bench" else "bench.__main__")
    build = getattr(mod, "build_parser", None) or mod._parser
    parser: argparse.ArgumentParser = build()
    return parser


Parsers = dict[str, argparse.ArgumentParser]


def _options(parser: argparse.ArgumentParser) -> tuple[set[str], Parsers]:
    flags = {o for a in parser._actions for o in a.option_strings}
    subs: Parsers = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            subs.update(action.choices)
    return flags, subs


def _check_mention(module: str, args: list[str], where: str) -> None:
    """The subcommand and every option a mention names exist (what it needs may be left out)."""
    parser = _parser(module)
    flags, subs = _options(parser)
    words = [a for a in args if not a.startswith("-")]
    if subs and words:
        names = words[0].split("/")  # `up/down/status`
        assert all(n in subs for n in names), f"{where}: no subcommand {words[0]}"
        flags |= {o for n in names for o in _options(subs[n])[0]}
    for arg in args:
        if arg.startswith("-"):
            assert arg.split("=", 1)[0] in flags, f"{where}: no option {arg}"


def _check_args(module: str, args: list[str], where: str) -> None:
    parser = _parser(module)

    def refuse(message: str) -> None:
        raise AssertionError(f"{where}: {message}")

    parser.error = refuse  # type: ignore[method-assign,assignment]
    for action in parser._actions:  # the subcommands' parsers too
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.error = refuse
    try:
        parser.parse_args(args)
    except SystemExit as exc:  # --help: fine
        assert exc.code == 0, f"{where}: exit {exc.code}"


def _make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-z][\w-]*):", text, flags=re.M))


COMMANDS = _all()


def test_the_documents_name_commands() -> None:
    assert len(COMMANDS) > 20  # the extraction itself works: the README names many


@pytest.mark.parametrize(
    ("doc", "line", "command", "whole"), COMMANDS, ids=[f"{d}:{n}" for d, n, _, _ in COMMANDS]
)
def test_each_named_command_exists_as_written(
    doc: str, line: int, command: str, whole: bool
) -> None:
    where = f"{doc}:{line}: {command}"
    argv = shlex.split(command)
    check = _check_args if whole else _check_mention
    if argv[0] == "make":
        assert not any(a.startswith("--") for a in argv[1:]), f"{where}: make takes no such option"
        targets = [t for t in argv[1:] if not t.startswith("-") and "=" not in t]
        assert set(targets) <= _make_targets(), f"{where}: no such make target"
        return
    if argv[0] == "sbatch":
        script = next(a for a in argv[1:] if not a.startswith("-"))
        assert (REPO / script).is_file(), f"{where}: no such script"
        args = argv[argv.index(script) + 1 :]
    elif argv[0] == "slurm-train":
        module, args = "jobs", argv[1:]
        check(module, args, where)
    else:
        rest = argv[argv.index("-m") + 1 :]
        module, args = rest[0], rest[1:]
        if module in ("jobs", "cluster", "train", "bench"):
            check(module, args, where)
        else:
            assert importlib.util.find_spec(module) is not None, f"{where}: no module {module}"
    for arg in args:  # a spec or script the command names is in the repository
        if arg.endswith((".yaml", ".yml", ".py")) and "/" in arg and not arg.startswith("/"):
            assert (REPO / arg).exists(), f"{where}: {arg} is not in the repository"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # headings inside code: none
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, flags=re.M)}


LINKS = [
    (doc, target)
    for doc in DOCS
    for target in re.findall(r"\]\(([^)\s]+)\)", (REPO / doc).read_text(encoding="utf-8"))
    if not target.startswith(("http://", "https://", "mailto:"))
]


@pytest.mark.parametrize(("doc", "target"), LINKS, ids=[f"{d}->{t}" for d, t in LINKS])
def test_each_link_between_the_documents_arrives(doc: str, target: str) -> None:
    """The README is split into documents (issue 45): a link to a moved section must follow."""
    path, _, anchor = target.partition("#")
    file = (REPO / doc).parent / path if path else REPO / doc
    assert file.exists(), f"{doc}: link to {target}: no such file"
    if anchor and file.suffix == ".md":
        assert anchor in _anchors(file), f"{doc}: link to {target}: no such heading there"
