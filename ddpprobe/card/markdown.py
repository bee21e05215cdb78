"""The card as Markdown (``PATH.md``), rendered from the card's JSON data alone.

Top to bottom: the seed question answered with this run's numbers (:mod:`ddpprobe.card.summary`), the run
(date, Python, torch, the Lightning package and its version, torchmetrics, backend, world sizes, machine,
command), the count of verdicts and their meaning, the sharding picture, then one section per test module
in the order of :data:`~ddpprobe.card.summary.TOPIC_ORDER`: the module's topic, one table row per test
case (the fact, i.e. the test's name as a sentence; its parameters; its verdict; the numbers it recorded;
its id), and under the table the docstrings that explain each fact. The first row of a function carries
the fact; its further cases show ``″``.
"""

from __future__ import annotations

from ddpprobe.card.schema import OUTCOMES
from ddpprobe.card.summary import SEED_QUESTION, anchor, further_reading, seed_answers


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _summary(card: dict) -> list:
    lines = ["## The seed question, answered by this run", "", f"> *{SEED_QUESTION}*", ""]
    for i, part in enumerate(seed_answers(card), start=1):
        answer = part["answer"]
        if answer is None:
            got = "; ".join(
                f"`{f['function']}`: "
                + (
                    f"{f['holds']} of {f['cases']} cases hold ({', '.join(f['verdicts'])})"
                    if f["cases"]
                    else "not in this run"
                )
                for f in part["facts"]
            )
            answer = f"**Not established by this run**: {got}."
        lines.append(f"{i}. **{part['question']}** {answer}")
        for fact in part["facts"]:
            if not fact["cases"]:
                continue
            numbers = (
                f" — {'; '.join(fact['numbers'])}" + (f" ({fact['case']})" if fact["case"] else "")
                if fact["numbers"]
                else ""
            )
            lines.append(
                f"   - [{fact['fact']}](#{anchor(fact['module'])}): {fact['holds']} of {fact['cases']} "
                f"case(s) hold{numbers}"
            )
    beyond = further_reading(card)
    if beyond:
        lines += ["", "Beyond the seed question:", ""]
        for pointer in beyond:
            sections = ", ".join(f"[{m}](#{anchor(m)})" for m in pointer["modules"])
            lines.append(f"- **{pointer['title']}** (`{pointer['page']}`): {sections}")
    return lines + [""]


def _header(card: dict) -> list:
    env = card["environment"]
    return [
        "## This run",
        "",
        "| | |",
        "| --- | --- |",
        f"| date | {card['generated']} |",
        f"| Python | {env['python']} |",
        f"| torch | {env['torch']} |",
        f"| Lightning | `{env['lightning_package']}` ({env['lightning_distribution']} {env['lightning']}) |",
        f"| torchmetrics | {env['torchmetrics']} |",
        f"| backend | {card['backend']} |",
        f"| world sizes (parametrised) | {', '.join(map(str, card['world_sizes'])) or '-'} |",
        f"| platform | {_cell(env['platform'])} |",
        f"| CPUs / GPUs | {env['cpu_count']} / {env['gpu_count']} |",
        f"| command | `{_cell(' '.join(['pytest', *card['command']]))}` |",
        "",
    ]


def _counts(card: dict) -> list:
    summary = card["summary"]
    counts = ", ".join(f"{o.words}: {summary[code]}" for code, o in OUTCOMES.items() if summary[code])
    legend = "; ".join(f"*{o.words}* = {o.meaning}" for o in OUTCOMES.values())
    contents = " · ".join(f"[{t['module']}](#{anchor(t['module'])})" for t in card["topics"])
    return [
        f"**{sum(summary.values())} facts** — {counts or 'none ran'}.",
        "",
        f"Verdicts: {legend}. `″` repeats the fact above for another parameter set.",
        "",
        f"Sections: {contents}" if contents else "Sections: none",
        "",
    ]


def _sharding(card: dict) -> list:
    sharding = card["sharding"]
    if sharding is None:
        return []
    lines = ["## Sharding, as a picture", ""]
    if not sharding["svg"]:
        return lines + [f"Not drawn: the world failed ({_cell(sharding['error'])}).", ""]
    padding = ", ".join(f"rank {r} slot {s}" for r, s in sharding["padding"]) or "none"
    return lines + [
        f"![Which samples each rank's validation_step saw]({sharding['svg']})",
        "",
        f"A real world: `validation.validate(n={sharding['n']}, batch_size={sharding['batch_size']})` at "
        f"world size {sharding['world_size']} ({sharding['backend']}). Row = rank, column = position in the "
        "rank's shard, number = sample id. `DistributedSampler` deals the ids round-robin and pads by dealing "
        f"the first ones again; those later copies are orange: {padding} "
        f"(samples {', '.join(map(str, sharding['duplicates'])) or 'none'} are evaluated twice).",
        "",
    ]


def _verdict(fact: dict) -> str:
    outcome = OUTCOMES[fact["outcome"]]
    verdict = fact["verdict"]
    if not outcome.detail and fact["outcome"] != "holds" and fact["detail"]:
        verdict += f" ({fact['detail']})"
    return f"**{verdict}**" if fact["outcome"] != "holds" else verdict


def _topic(topic: dict) -> list:
    lines = [
        f"## {topic['module']}",
        "",
        f"`{topic['path']}`" + (f": {topic['topic']}" if topic["topic"] else ""),
        "",
        "| fact | case | verdict | numbers | test id |",
        "| --- | --- | --- | --- | --- |",
    ]
    previous, explained = None, []
    for fact in topic["facts"]:
        text = "″" if fact["function"] == previous else fact["fact"]
        if fact["function"] != previous:
            explained.append(fact)
        previous = fact["function"]
        case = ", ".join(f"{k}={v}" for k, v in fact["params"].items()) or (fact["case"] or "")
        numbers = "; ".join(n["text"] for n in fact["numbers"])
        lines.append(
            f"| {_cell(text)} | {_cell(case)} | {_cell(_verdict(fact))} | {_cell(numbers)} | "
            f"`{_cell(fact['nodeid'])}` |"
        )
    lines.append("")
    with_doc = [f for f in explained if f["explanation"]]
    if with_doc:
        lines += ["<details><summary>Why: each fact explained (its docstring)</summary>", ""]
        lines += [f"- **{_cell(f['fact'])}** {_cell(f['explanation'])}" for f in with_doc]
        lines += ["", "</details>", ""]
    return lines


def render_markdown(card: dict) -> str:
    """The card as Markdown (the text written to ``PATH.md``); ``card`` is valid per ``schema.json``."""
    env = card["environment"]
    lines = [
        "# The semantics card",
        "",
        "What PyTorch Lightning DDP synchronizes and logs, as established by one run of the ddpprobe facts "
        f"on `{env['lightning_package']}` {env['lightning']}. Each row is one test case: its fact is the "
        "test's name, its verdict that test's outcome in this run. Generated by `ddpprobe.card` "
        "(`pytest --semantics-report`); do not edit by hand.",
        "",
    ]
    lines += _summary(card) + _header(card) + _counts(card) + _sharding(card)
    for topic in card["topics"]:
        lines += _topic(topic)
    if card["left_out"]:
        lines += ["## Left out", "", "Tests of the tooling (marked `not_a_fact`), not facts about DDP:", ""]
        lines += [f"- `{_cell(nodeid)}`" for nodeid in card["left_out"]]
        lines.append("")
    return "\n".join(lines)
