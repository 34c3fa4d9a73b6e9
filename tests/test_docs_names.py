"""The names the documentation uses exist in the code (README.md, docs/, examples/, --help): every
`scout_sys_*` metric a page, an alert rule or the Grafana dashboard names is one the exporter serves;
every JSON field the JSON pages show is one the code writes; every incident kind, verdict status and
event a page names is one the code has, and the runbook has a row for every kind. Flags:
tests/test_docs_examples.py."""

from __future__ import annotations

import ast
import re
from functools import cache

from scout_sys.consensus.kinds import KINDS
from scout_sys.model import ATTRIBUTED, INCONCLUSIVE
from tests._docs import PAGES, ROOT, _blocks, _text

SRC = ROOT / "scout_sys"
DOC_FILES = [*PAGES, *(ROOT / "examples").iterdir(), *(p for p in (ROOT / "deploy").rglob("*") if p.is_file())]


def _docs_text() -> str:
    from tests.test_docs_examples import _verb_help

    return "\n".join([*(_text(p) for p in DOC_FILES), *_verb_help().values()])


# ------------------------------------------------------------------ metric names


def _served_metrics() -> set[str]:
    """The metric names the exporter's source writes: each family's name, counters with `_total`."""
    src = _text(SRC / "exporters" / "prometheus.py")
    counters = set(re.findall(r'CounterMetricFamily\(\s*"(scout_sys_[a-z0-9_]+)"', src))
    names = set(re.findall(r'"(scout_sys_[a-z0-9_]+)"', src)) - counters
    return names | {f"{c}_total" for c in counters}


def test_every_metric_the_docs_name_is_served() -> None:
    served = _served_metrics()
    assert {"scout_sys_probe_up", "scout_sys_polls_total", "scout_sys_gpu_ecc_uncorrected_errors_total"} <= served
    named = set(re.findall(r"\bscout_sys_[a-z0-9_]*[a-z0-9]\b", _docs_text()))
    named = {n for n in named if not (SRC / n.removeprefix("scout_sys_")).exists()}  # a module path, not a metric
    assert len(named) > 20, named
    assert sorted(named - served) == []


def test_the_served_metrics_are_real_scrape_names() -> None:
    """The source reading above is the exporter's: a real scrape's names are among them."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.test_docs_ops import _real_scrape

    scraped = {s.name for f in text_string_to_metric_families(_real_scrape()) for s in f.samples
               if s.name.startswith("scout_sys_") and not s.name.endswith("_created")}
    assert len(scraped) > 10 and scraped <= _served_metrics(), scraped - _served_metrics()


# ------------------------------------------------------------------ JSON fields


@cache
def _written_names() -> frozenset[str]:
    """Every string literal and every field or keyword name in scout_sys/: what JSON the code writes can
    hold as a key (dict literals, `asdict` of dataclass fields, `dict(key=...)`)."""
    out: set[str] = set()
    suffixes: set[str] = set()
    for f in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(_text(f))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.add(node.value)
                out |= set(re.findall(r'"([A-Za-z_][\w]*)"', node.value))  # keys inside JSON text
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out.add(node.target.id)
            elif isinstance(node, ast.keyword) and node.arg:
                out.add(node.arg)
            elif (isinstance(node, ast.JoinedStr) and len(node.values) == 2
                  and isinstance(node.values[1], ast.Constant) and re.fullmatch(r"_[a-z]+", node.values[1].value)):
                suffixes.add(node.values[1].value)  # f"{k}_size": a key named after another
    return frozenset(out | {f"{n}{s}" for n in out for s in suffixes if re.fullmatch(r"[a-z_]+", n)})


def _json_keys(text: str) -> set[str]:
    """The keys of the JSON the page's code blocks show (`"key":`)."""
    return {k for b in _blocks(text) for k in re.findall(r'"([A-Za-z_][\w]*)"\s*:', b)}


def test_every_json_field_the_docs_show_is_one_the_code_writes() -> None:
    shown = {}
    for p in PAGES:
        for k in _json_keys(_text(p)):
            shown.setdefault(k, p.name)
    # json.md's prose names fields and values in backticks
    for tok in re.findall(r"`([a-z][a-z0-9_]*)`", _text(ROOT / "docs" / "json.md")):
        if re.fullmatch(r"v\d+", tok):  # the schema's version
            continue
        shown.setdefault(tok, "json.md")
    assert {"cpu_percent", "layout_source", "layout_from", "coverage", "peer_groups", "device_slow"} <= set(shown)
    written = _written_names()
    assert sorted((p, k) for k, p in shown.items() if k not in written) == []


def test_the_documented_rank_record_is_what_to_json_writes() -> None:
    """The rank record of docs/json.md, field by field, against a real report's ranks and the code."""
    import json

    d = json.loads(_text(ROOT / "tests" / "data" / "megatron_lock_report.json"))
    block = _text(ROOT / "docs" / "json.md").split('"ranks": [', 1)[1].split("\n      ...\n", 1)[0]
    doc_fields = set(re.findall(r'"([a-z_]+)":', block))
    real = set().union(*(r.keys() for r in d["job"]["ranks"]))
    optional = {"coords", "dp", "pp", "container_pid", "cpu_percent", "collective", "where", "local_rank", "device"}
    assert real - doc_fields == set(), real - doc_fields  # every field a real report has is documented
    assert doc_fields - real <= optional, doc_fields - real


# ------------------------------------------------------------------ kinds, statuses, events


def test_every_kind_the_docs_name_exists_and_the_readme_lists_them_all() -> None:
    text = _docs_text()
    named = set(re.findall(r"INCIDENT ([a-z_]+) \((\w+)\)", text))
    assert named and {k for k, _ in named} <= set(KINDS) and {s for _, s in named} <= {ATTRIBUTED, INCONCLUSIVE}
    named_kinds = set(re.findall(r'"kind":\s*"([a-z_]+)"', text)) | set(re.findall(r"kind=([a-z_]+)", text))
    assert named_kinds <= set(KINDS), named_kinds - set(KINDS)
    readme = _text(ROOT / "README.md")
    sentence = readme.split("Incident kinds:", 1)[1].split("Each carries", 1)[0]
    assert re.findall(r"`([a-z_]+)` \(", sentence) == list(KINDS)


def test_the_runbook_has_a_row_for_every_kind_with_an_owner_and_a_drain_answer() -> None:
    table = _text(ROOT / "docs" / "runbook.md").split("| verdict |", 1)[1].split("\n\n", 1)[0]
    rows = [r for r in table.splitlines()[2:] if r.startswith("| `")]
    kinds = {re.match(r"\| `([a-z_]+)`", r).group(1) for r in rows}
    assert kinds == set(KINDS), kinds ^ set(KINDS)
    for r in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", r)[1:-1]]
        assert len(cells) == 5 and all(cells), r  # verdict, meaning, do now, owner, drain?
        assert re.match(r"(no|yes|not this one|only)\b", cells[4]), cells[4]


def test_every_event_the_docs_name_is_one_the_code_emits() -> None:
    text = _docs_text()
    events = set(re.findall(r'"event":\s*"([a-z_]+)"', text))
    events |= set(re.findall(r"`((?:incident|agent|checkpoint|job)_[a-z_]+)`", text))
    assert {"incident_opened", "incident_updated", "incident_closed", "checkpoint_written"} <= events
    written = _written_names()
    assert sorted(e for e in events if e not in written) == []


# ------------------------------------------------------------------ the glossary, from the first use

# The glossary's terms that are no ordinary English words ("pause" and "window" are, too often to link
# each first use: tests/test_docs_examples.py checks their links land).
_TERMS = {"c3": r"C3", "gpu-shape": r"GPU shape", "gloo-shape": r"Gloo shape", "witness": r"witness(?:es)?",
          "common-mode": r"common[- ]mode", "signature": r"signatures?", "sealed": r"sealed", "origin": r"origins?"}


def test_each_glossary_term_is_linked_where_a_page_first_uses_it() -> None:
    """Outside code, quotes (the tool's own messages), headings and bold (a term's own section), the first use of each term on each
    page is a link to its glossary entry."""
    missing = []
    for p in PAGES:
        text = re.sub(r"^```.*?^```", "", _text(p), flags=re.M | re.S)
        text = re.sub(r"`[^`\n]*`|\"[^\"\n]*\"|^#+ .*$|\*\*[^*\[\n]*\*\*", "", text, flags=re.M)
        if p.name == "how-it-works.md":
            text = text.split("## Glossary", 1)[0]
        for anchor, rx in _TERMS.items():
            m = re.search(rf"(?<![\w#-]){rx}(?![\w-])", text)
            if m is None:
                continue
            link = re.match(r"[^\[\]\n]*\]\(([^)]*)\)", text[m.end():])
            opened = text.rfind("[", 0, m.start()) > text.rfind("]", 0, m.start())
            if not (opened and link and link.group(1).endswith(f"#{anchor}")):
                missing.append((p.name, anchor, text[max(0, m.start() - 40):m.end() + 20]))
    assert missing == [], missing


def test_the_runbooks_certify_table_has_a_row_for_each_next_certify_says() -> None:
    """Each `next:` row of the runbook is a text certify writes, and each text certify writes has a row."""
    src = _text(SRC / "replay" / "certify.py")
    body = src.split("def _advice", 1)[1]
    said = re.findall(r'(?:return why, |^\s+)f?"((?:restart from|run a round now|while the job runs|go back to)[^"{]*)',
                      body, re.M)
    assert len(said) >= 4, said
    table = _text(ROOT / "docs" / "runbook.md").split("| `next:` says | do |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `([^`]*)` \|", table, re.M)
    assert len(rows) == 4, rows
    for row in rows:
        assert any(row.startswith(s.rstrip()) or s.startswith(row.split(" X")[0]) for s in said), row
    for s in said:
        assert any(row.startswith(s.split(":")[0]) for row in rows), s


def test_the_probe_lists_of_the_docs_are_the_probes_of_the_code() -> None:
    """metrics.md's scout_sys_probe_up row and the glossary's probe entry name exactly the probes."""
    from scout_sys.probes.ebpf import comms

    probes = {m for f in (SRC / "probes").rglob("*.py") for m in re.findall(r'^    name = "([a-z-]+)"', _text(f), re.M)}
    probes = (probes - {"ebpf"}) | {comms.SOURCE}  # "ebpf": the eBPF probes' base class
    row = next(x for x in _text(ROOT / "docs" / "metrics.md").splitlines() if x.startswith("| `scout_sys_probe_up"))
    assert set(re.findall(r"`([a-z-]+)`", row.split("1 attached, 0 off", 1)[1].split(")", 1)[0])) == probes
    entry = _text(ROOT / "docs" / "how-it-works.md").split('<a id="probe"></a>', 1)[1].split("\n- ", 1)[0]
    assert set(re.findall(r"[a-z]+(?:-[a-z]+)?", entry.split("(", 1)[1].split(")", 1)[0])) == probes
