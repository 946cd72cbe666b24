"""docs/production.md names only what exists: its ``gtm`` commands parse with the real
command tree, and its metrics, alerts, dashboard panels, files and ``GTM_…`` variables are
in the repository.

What is checked, and where it is taken from in the guide:

* every ``gtm …`` invocation in a fenced ``sh`` block or an inline code span: each
  subcommand exists, each ``--flag`` is an option of the (sub)command it follows, a value
  of a choice (``--log-format json``, ``drain region``) is one of its choices;
* every other inline ``--flag`` is an option of some ``gtm`` command, unless it is listed
  in :data:`FOREIGN_FLAGS` (etcd's own flags);
* every ``gtm_…`` metric name (a counter's ``_total``, a histogram's ``_bucket``…
  included) is defined by a string literal in the product's packages;
* every ``Gtm…`` alert is a rule of deploy/prometheus/gtm-alerts.yaml, every “quoted”
  title a panel of deploy/grafana/gtm-overview.json;
* every repository path in an inline code span or a link exists;
* every ``GTM_…`` variable is an option's variable or a literal in the product's code.

The checkers are plain functions, so the tests below also prove they catch a renamed
flag, subcommand, choice or metric in a guide that names one.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import click
import pytest
import yaml

from gtmctl.cli import cli

ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "docs" / "production.md"
#: Packages whose code defines metrics and reads variables (what is installed).
PRODUCT = ("gtm", "global_lb", "regional_lb", "zone_agent", "gpusim", "policies", "gtmctl", "chaos")
ALERTS = ROOT / "deploy" / "prometheus" / "gtm-alerts.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "gtm-overview.json"

#: Flags the guide names that belong to another program (etcd's, in its TLS section).
FOREIGN_FLAGS = frozenset(
    {
        "--cert-file",
        "--key-file",
        "--trusted-ca-file",
        "--client-cert-auth",
        "--peer-cert-file",
        "--peer-key-file",
        "--peer-trusted-ca-file",
        "--peer-client-cert-auth",
        "--heartbeat-interval",
        "--election-timeout",
        "--auto-compaction-retention",
    }
)

#: Names that stand for any flag or variable (the ``--foo-bar`` is ``GTM_FOO_BAR`` rule).
PLACEHOLDERS = frozenset({"--foo-bar", "GTM_FOO_BAR"})

#: Subcommands the guide must exercise: proves the extraction found its commands.
EXPECTED_COMMANDS = frozenset(
    {
        "global",
        "regional",
        "zone",
        "policy apply",
        "policy export",
        "policy check",
        "drain",
        "undrain",
        "audit verify",
        "state ls",
        "chaos run",
    }
)

_FENCE = re.compile(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"`([^`\n]+)`")
_METRIC = re.compile(r"\bgtm_[a-z0-9_]+\b")
_ALERT = re.compile(r"\bGtm[A-Z][A-Za-z0-9]+\b")
_PANEL = re.compile(r"“([^”]+)”")
_VARIABLE = re.compile(r"\bGTM_[A-Z0-9_]+\b")
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*\*?")
_SCRIPT = re.compile(r"\bpython3? (bench/[\w/]+\.py)((?: [^|;&#`\n]*)?)")
_LINK = re.compile(r"\]\(([^)#\s]+)")
_METRIC_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")
_SHELL_OPERATORS = frozenset({"|", "||", "&&", ";", ">", ">>", "<", "&", "2>", "(", ")"})


# ------------------------------------------------------------------- extraction


def code_blocks(text: str, languages: frozenset[str] = frozenset({"sh"})) -> list[str]:
    """The bodies of fenced blocks in ``languages``."""
    return [body for lang, body in _FENCE.findall(text) if lang in languages]


def prose(text: str) -> str:
    """``text`` without its fenced blocks."""
    return _FENCE.sub("", text)


def _logical_lines(block: str) -> Iterator[str]:
    """Lines with backslash continuations joined."""
    pending = ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield pending + line
        pending = ""
    if pending:
        yield pending


def gtm_invocations(text: str) -> list[list[str]]:
    """The arguments of every ``gtm`` invocation in the ``sh`` blocks and inline code
    spans of ``text`` (the program itself left out, up to the first shell operator)."""
    lines = [line for block in code_blocks(text) for line in _logical_lines(block)]
    lines += [span for span in _INLINE.findall(prose(text)) if span.startswith("gtm ")]
    found = []
    for line in lines:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
        starts = [i for i, token in enumerate(tokens) if token == "gtm" or token.endswith("/gtm")]
        if not starts:
            continue
        args = []
        for token in tokens[starts[0] + 1 :]:
            if token in _SHELL_OPERATORS:
                break
            args.append(token)
        found.append(args)
    return found


# ------------------------------------------------------------------- checking


def _option(command: click.Command, name: str) -> click.Option | None:
    for param in command.params:
        if isinstance(param, click.Option) and name in (*param.opts, *param.secondary_opts):
            return param
    return None


def _choice_problem(param: click.Parameter, value: str, where: str) -> str | None:
    if isinstance(param.type, click.Choice) and value not in param.type.choices:
        return f"{where}: {value!r} is not one of {list(param.type.choices)}"
    return None


def check_invocation(args: list[str]) -> tuple[str, list[str]]:
    """The subcommand path ``args`` reach (``"policy apply"``) and what is wrong in them."""
    command: click.Command = cli
    path: list[str] = []
    problems: list[str] = []
    positionals: list[str] = []
    tokens = iter(args)
    for token in tokens:
        where = "gtm " + " ".join(path) if path else "gtm"
        if token.startswith("-") and token != "-":
            name, has_value, value = token.partition("=")
            if name in ("-h", "--help"):
                continue
            option = _option(command, name)
            if option is None:
                problems.append(f"{where}: no option {name}")
                continue
            if option.is_flag or option.count:
                continue
            if not has_value:
                value = next(tokens, "")
            if problem := _choice_problem(option, value, f"{where} {name}"):
                problems.append(problem)
            continue
        if isinstance(command, click.Group) and not positionals:
            with click.Context(command) as ctx:
                sub = command.get_command(ctx, token)
            if sub is None:
                problems.append(f"{where}: no subcommand {token!r}")
                return " ".join(path), problems
            command = sub
            path.append(token)
            continue
        positionals.append(token)
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    for param, value in zip(arguments, positionals, strict=False):
        if param.nargs == 1 and (problem := _choice_problem(param, value, "gtm " + " ".join(path))):
            problems.append(problem)
    return " ".join(path), problems


def _walk(command: click.Command) -> Iterator[click.Command]:
    yield command
    if isinstance(command, click.Group):
        with click.Context(command) as ctx:
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None:
                    yield from _walk(sub)


@cache
def every_option() -> tuple[frozenset[str], frozenset[str]]:
    """Every long option name of every ``gtm`` command, and every option's variable."""
    names: set[str] = set()
    variables: set[str] = set()
    for command in _walk(cli):
        for param in command.params:
            if isinstance(param, click.Option):
                names.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--"))
                envvar = param.envvar
                variables.update([envvar] if isinstance(envvar, str) else envvar or ())
    return frozenset(names), frozenset(variables)


@cache
def product_source() -> str:
    return "\n".join(
        path.read_text("utf-8") for package in PRODUCT for path in (ROOT / package).rglob("*.py")
    )


def metric_problems(text: str) -> list[str]:
    source = product_source()
    problems = []
    for name in sorted(set(_METRIC.findall(text))):
        base = name
        for suffix in _METRIC_SUFFIXES:
            base = base.removesuffix(suffix)
        if not any(f'"{candidate}"' in source for candidate in (base, base + "_total")):
            problems.append(f"metric {name}: no {base!r} defined in {', '.join(PRODUCT)}")
    return problems


def flag_problems(text: str) -> list[str]:
    """Inline spans that start with a ``--flag`` (``--tls-*``: any flag so named) naming
    one no ``gtm`` command has; spans of other programs' command lines are left to
    :func:`script_problems` (benchmarks) or not checked."""
    names, _ = every_option()
    problems = []
    for span in _INLINE.findall(prose(text)):
        if not span.startswith("--"):
            continue
        for flag in _FLAG.findall(span):
            if flag.endswith("*"):
                known = any(name.startswith(flag[:-1]) for name in names)
            else:
                known = flag in names or flag in FOREIGN_FLAGS or flag in PLACEHOLDERS
            if not known:
                problems.append(f"flag {flag} (in `{span}`): no gtm command has it")
    return problems


def script_problems(text: str) -> list[str]:
    """``python bench/….py --flag`` anywhere: the script exists and defines the flag."""
    problems = []
    for script, args in _SCRIPT.findall(text):
        path = ROOT / script
        if not path.is_file():
            problems.append(f"script {script}: does not exist")
            continue
        source = path.read_text("utf-8")
        problems += [
            f"script {script}: no option {flag}"
            for flag in _FLAG.findall(args)
            if f'"{flag}"' not in source
        ]
    return problems


def variable_problems(text: str) -> list[str]:
    _, variables = every_option()
    source = product_source()
    return [
        f"variable {name}: neither an option's variable nor used in the code"
        for name in sorted(set(_VARIABLE.findall(text)))
        if name not in variables and f'"{name}"' not in source and name not in PLACEHOLDERS
    ]


def path_problems(text: str) -> list[str]:
    """Repository paths in inline code spans (from the repository's root) and relative
    links (from the guide's directory) that do not exist."""
    top_level = {p.name for p in ROOT.iterdir()}
    candidates = {
        (GUIDE.parent, link)
        for link in _LINK.findall(text)
        if not link.startswith(("http://", "https://", "mailto:"))
    }
    for span in _INLINE.findall(prose(text)):
        if " " in span or "/" not in span or span.startswith(("/", "~", "$", "http")):
            continue
        if span.split("/", 1)[0] in top_level:
            candidates.add((ROOT, span))
    return [
        f"path {candidate}: does not exist"
        for base, candidate in sorted(candidates)
        if not any(base.glob(candidate)) and not (base / candidate).exists()
    ]


def alert_problems(text: str) -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text("utf-8"))
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    return [f"alert {a}: not in {ALERTS.name}" for a in sorted(set(_ALERT.findall(text)) - alerts)]


def _panel_titles(panels: list[dict[str, object]]) -> Iterator[str]:
    for panel in panels:
        if isinstance(title := panel.get("title"), str):
            yield title
        inner = panel.get("panels")
        if isinstance(inner, list):
            yield from _panel_titles(inner)


def panel_problems(text: str) -> list[str]:
    titles = set(_panel_titles(json.loads(DASHBOARD.read_text("utf-8"))["panels"]))
    return [
        f"panel “{title}”: not in {DASHBOARD.name}"
        for title in sorted({" ".join(found.split()) for found in _PANEL.findall(text)} - titles)
    ]


# ------------------------------------------------------------------- the guide


@pytest.fixture(scope="module")
def guide() -> str:
    return GUIDE.read_text("utf-8")


def test_every_gtm_command_and_flag_parses(guide: str) -> None:
    invocations = gtm_invocations(guide)
    reached = set()
    problems = []
    for args in invocations:
        path, found = check_invocation(args)
        reached.add(path)
        problems += [f"gtm {' '.join(args)}\n    {p}" for p in found]
    assert problems == []
    assert reached >= EXPECTED_COMMANDS, sorted(EXPECTED_COMMANDS - reached)


def test_every_other_flag_is_a_gtm_option_or_a_named_foreign_one(guide: str) -> None:
    assert flag_problems(guide) == []


def test_every_metric_exists(guide: str) -> None:
    assert len(set(_METRIC.findall(guide))) >= 15
    assert metric_problems(guide) == []


def test_every_alert_and_panel_exists(guide: str) -> None:
    assert len(set(_PANEL.findall(guide))) >= 15
    assert alert_problems(guide) == []
    assert panel_problems(guide) == []


def test_every_alert_of_the_rules_is_in_the_guide(guide: str) -> None:
    rules = yaml.safe_load(ALERTS.read_text("utf-8"))
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    assert alerts <= set(_ALERT.findall(guide))


def test_every_benchmark_command_exists(guide: str) -> None:
    assert len(_SCRIPT.findall(guide)) >= 4
    assert script_problems(guide) == []


def test_every_path_exists(guide: str) -> None:
    assert path_problems(guide) == []


def test_every_variable_exists(guide: str) -> None:
    assert variable_problems(guide) == []


# ------------------------------------------------------------------- the checkers


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (
            "gtm regional --region eu-west --zone-urls a=http://x",
            "gtm regional: no option --zone-urls",
        ),
        ("gtm drian region eu-west", "gtm: no subcommand 'drian'"),
        ("gtm policy aply x --state y", "gtm policy: no subcommand 'aply'"),
        ("gtm drain regions eu-west", "'regions' is not one of"),
        ("gtm --log-format yaml global", "gtm --log-format: 'yaml' is not one of"),
        ("gtm zone --split capacity", "gtm zone: no option --split"),
        ("GTM_STATE=x /opt/gtm/bin/gtm audit verify d --anchors x", "no option --anchors"),
    ],
)
def test_a_wrong_command_or_flag_is_caught(line: str, problem: str) -> None:
    text = f"Some prose.\n\n```sh\n{line}   # a comment\n```\n"
    [args] = gtm_invocations(text)
    _, problems = check_invocation(args)
    assert len(problems) == 1
    assert problem in problems[0]


def test_right_commands_pass_and_continuations_join() -> None:
    text = (
        "```sh\n"
        "gtm regional --region eu-west \\\n  --zone-url a=https://x --split=envoy | tee log\n"
        "gtm policy apply --dry-run policies/examples --state etcd://h:2379 && echo ok\n"
        "```\n"
        "Inline: `gtm drain zone eu-west-a --force`.\n"
    )
    invocations = gtm_invocations(text)
    assert [check_invocation(args) for args in invocations] == [
        ("regional", []),
        ("policy apply", []),
        ("drain", []),
    ]
    assert invocations[0][-1] == "--split=envoy"  # the pipe ended it


def test_a_renamed_metric_alert_panel_path_flag_or_variable_is_caught() -> None:
    text = (
        "`gtm_regional_responsez_total` and `gtm_regional_responses_total`; GtmRegionGone; "
        "“Requests by regions”; `deploy/systemd/gtm-glob.service`; "
        "`--tls-plain-worker`; `--tlz-*`; GTM_STAT. `python bench/footprint.py --region 1`; "
        "[the guide](production.md), [no such page](dns-delegations.md)\n"
    )
    assert [p.split(":")[0] for p in metric_problems(text)] == [
        "metric gtm_regional_responsez_total"
    ]
    assert alert_problems(text) == ["alert GtmRegionGone: not in gtm-alerts.yaml"]
    assert len(panel_problems(text)) == 1
    assert path_problems(text) == [
        "path deploy/systemd/gtm-glob.service: does not exist",
        "path dns-delegations.md: does not exist",
    ]
    assert len(flag_problems(text)) == 2
    assert script_problems(text) == ["script bench/footprint.py: no option --region"]
    assert variable_problems(text) == [
        "variable GTM_STAT: neither an option's variable nor used in the code"
    ]
