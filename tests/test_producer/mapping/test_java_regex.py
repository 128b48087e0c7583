"""``route.topic.regex`` routes as Java does, or is refused (issue #44, defects 2 and 4; docs/debezium.md).

The oracle is the JDK's own ``java.util.regex`` running Kafka's RegexRouter logic (``matches()`` on the
routed value, then ``replaceFirst(replacement)``; no match: the value as is), launched once for the whole
corpus as a single-file source program. The relay's side is the topic expression the relay runs, on the
test Postgres, in one statement. Every pattern must be either refused at config load or route every value
of the corpus to Java's topic.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.errors import ConfigError, SchemaError
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.mapping._event_router import EventRouter
from harvest_outbox.producer.mapping.table import DebeziumMapping, table_mapping
from harvest_outbox.producer.ops._check import check_outbox
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db

# RegexRouter.apply, as Kafka Connect runs it for Debezium's outbox router. Lines in: pattern, replacement
# and value, tab-separated, each as hex of its UTF-8; lines out: OK and the topic (hex), or ERR when Java
# refuses the pattern or the replacement.
_ORACLE = """
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.regex.*;

public class RegexRouterOracle {
    static String dec(String h) {
        byte[] b = new byte[h.length() / 2];
        for (int i = 0; i < b.length; i++) b[i] = (byte) Integer.parseInt(h.substring(2 * i, 2 * i + 2), 16);
        return new String(b, StandardCharsets.UTF_8);
    }
    static String enc(String s) {
        StringBuilder sb = new StringBuilder();
        for (byte x : s.getBytes(StandardCharsets.UTF_8)) sb.append(String.format("%02x", x));
        return sb.toString();
    }
    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(System.out, false, "UTF-8");
        for (String line; (line = in.readLine()) != null; ) {
            String[] f = line.split("\\t", -1);
            try {
                String value = dec(f[2]);
                Matcher m = Pattern.compile(dec(f[0])).matcher(value);
                out.println("OK\\t" + enc(m.matches() ? m.replaceFirst(dec(f[1])) : value));
            } catch (RuntimeException e) {
                out.println("ERR\\t" + enc(String.valueOf(e)));
            }
        }
        out.flush();
    }
}
"""

P = "p.${a}"
# (regex, replacement, accepted): accepted None means "either", True/False pin what the issue requires.
CORPUS: list[tuple[str, str, bool | None]] = [
    # the defaults and the common shapes
    ("(?<routedByValue>.*)", "outbox.event.${routedByValue}", True),
    ("(?<routedByValue>.+)", "outbox.event.${routedByValue}", True),
    ("(.*)", "cost\\$.$1", True),
    ("(?<svc>[a-z]+)\\.(?<kind>.*)", "${kind}-$1", True),
    ("(?<a>.*)\\.(?<b>.*)", "${b}.${a}", True),
    ("(?<a>[^.]*)\\.(?<b>.*)", "${b}.${a}", True),
    ("prefix\\.(?<a>.*)", P, True),
    ("(?<a>.*)(?<b>\\.events)", "${b}.${a}", True),
    ("(?:(?<a>[a-z]+)_)(?<b>.*)", "${a}/${b}", True),
    ("((?<a>[a-z]+)(?<b>[0-9]*))", "$1|${a}|${b}", True),
    ("(?<a>\\w+)", "$0.x", True),
    ("^(?<a>[a-z]*)$", P, True),
    # escapes and classes (Java's \d \w \s are ASCII; Postgres' follow the locale)
    ("(?<a>\\d+)-(?<b>\\D*)", "${b}:${a}", True),
    ("(?<a>\\s*)(?<b>\\S+)(?<c>\\s*)", "[${a}|${b}|${c}]", True),
    ("(?<a>[\\w.-]+)", P, True),
    ("(?<a>\\W+)", P, True),
    ("(?<a>[^a-z]+)", P, True),
    ("(?<a>\\x41\\u00e9)", P, True),
    ("(?<a>é+)(?<b>.*)", "${b}${a}", True),
    ("(?<a>[à-ÿ]+)", P, True),
    ("(?<a>\\$)(?<b>.*)", "${b}", True),
    ("(?<a>[\\]\\[]+)", P, None),
    ("(?<a>a-b|c\\|d)", P, True),
    # anchors and word boundaries (defect 4: \b is backspace in Postgres)
    ("\\b(?<a>\\w+)\\b", P, True),
    ("\\B(?<a>\\w+)", P, True),
    ("(?<a>\\w)\\B(?<b>\\w*)", "${a}.${b}", True),
    ("(?<a>[a-z]+)\\b(?<b>.*)", "${a}.${b}", None),
    ("(?<a>.+)\\b", P, None),
    ("(?<a>[a-z]*)(?<b>\\n?)$", "${a}|${b}", True),
    ("(?<a>[a-z\\n]*)$", P, True),
    # quantifiers: greedy splits, counted, lazy, possessive (defect 2)
    ("(?<a>a*)(?<b>a*)", "${a}.${b}", True),
    ("(?<a>a?)(?<b>[ab]{0,2})(?<c>b*)", "${a}.${b}.${c}", True),
    ("(?<a>x{2,3})(?<b>x*)", "${a}.${b}", True),
    ("(?<a>[a-z]*)(?<b>[a-z0-9]*)", "${a}.${b}", True),
    ("(?<routedByValue>[a-z]++)", P.replace("a}", "routedByValue}"), False),
    ("(?<a>.*?)(?<b>s?)", "${a}.${b}", False),
    ("(?<a>a{2,}?)", P, False),
    ("a{256}", "x", False),
    # alternation (defect 4: POSIX takes the longest alternative, Java the first)
    ("(?<a>a|ab)(?<b>c|bcd)(?<d>d*)", "p.${a}.${b}.${d}", False),
    ("(?<a>order|orders)", P, False),
    ("(?<a>orders|customers)", P, True),
    ("orders|customers", "x", True),
    ("(?<a>abc|bcd)(?<b>d*)", "${a}.${b}", True),
    # edges: the empty pattern, empty groups, zero counts, '-' as a class member
    ("", "empty", None),
    ("()", "e$1", None),
    ("(?<a>x{0})(?<b>.*)", "${b}", None),
    ("(?<a>[-a]+)(?<b>[a-]*)", "${a}.${b}", None),
    ("(?<a>[\\s\\d]+)", P, None),
    # everything else is refused
    ("(?<a>ab)?", P, False),
    ("(?=x).*", "x", False),
    ("(?i)orders", "x", False),
    ("(\\w)\\1", "x", False),
    ("\\p{Alpha}+", "x", False),
    ("(unclosed", "x", False),
    (
        "(?<a>.)(?<b>.)(?<c>.)(?<d>.)(?<e>.)(?<f>.)(?<g>.)(?<h>.)(?<i>.)",
        "${i}${h}${g}${f}${e}${d}${c}${b}${a}$10",
        True,
    ),
    ("(.)(.)(.)(.)(.)(.)(.)(.)(.)(.)", "$10", False),
]
VALUES = [
    "orders", "Orders", "order", "customers", "orders.created", "a.b.c", "x.events", "ab_cd_ef", "abc123",
    "", "a", "aa", "aaa", "ab", "abb", "abcd", "bcd", "xx", "xxx", "xxxxx", "123-abc", "12-", "-",
    "a b", " a ", "\t", "a\n", "a\nb", "\n", "a\r\n", "a\u2028b", "a\u0085", "a-b", "c|d", "$x", "a\\b",
    "][", "é", "éé", "éa", "aé", "Aé", "àÿ", "日本", "😀", "a😀b", "prefix.x", "prefix.", "ORDERS",
    "orders1", "abcdefghi", "abcdefghij", "a.b", "Δ_1",
]  # fmt: skip


def _java_topics(tmp_path: Path, cases: list[tuple[str, str, str]]) -> list[str | None]:
    """Java's topic for each (regex, replacement, value); None where Java refuses the pattern."""
    java = shutil.which("java")
    if java is None:
        pytest.fail(
            "the differential test needs a JDK 11+ `java` on PATH (Java 17 is a prerequisite: docs/prerequisites.md)"
        )
    source = tmp_path / "RegexRouterOracle.java"
    source.write_text(_ORACLE)
    lines = "".join("\t".join(x.encode().hex() for x in case) + "\n" for case in cases)
    run = subprocess.run([java, str(source)], input=lines, capture_output=True, text=True, timeout=120, check=True)
    out: list[str | None] = []
    for line in run.stdout.splitlines():
        status, text = line.split("\t")
        out.append(bytes.fromhex(text).decode() if status == "OK" else None)
    assert len(out) == len(cases), run.stderr
    return out


def _accept(corpus: list[tuple[str, str]]) -> tuple[dict[int, DebeziumMapping], dict[int, str]]:
    """Each pattern's mapping as the config loader builds it, or the loader's refusal."""
    accepted: dict[int, DebeziumMapping] = {}
    refused: dict[int, str] = {}
    for k, (regex, replacement) in enumerate(corpus):
        try:
            m = table_mapping("debezium", {"route.topic.regex": regex, "route.topic.replacement": replacement})
        except ConfigError as exc:
            refused[k] = str(exc)
            continue
        assert isinstance(m, DebeziumMapping)
        accepted[k] = m
    return accepted, refused


def _differences(
    pg_dsn: str, tmp_path: Path, corpus: list[tuple[str, str]], accepted: dict[int, DebeziumMapping], values: list[str]
) -> tuple[list[str], dict[tuple[int, int], str]]:
    """Every (accepted pattern, value) whose relay topic is not Java's, and the relay's topics."""
    java = _java_topics(tmp_path, [(regex, repl, v) for regex, repl in corpus for v in values])
    # One statement: each accepted pattern's topic expression over all values.
    parts = [
        sql.SQL("SELECT {k}, i, {topic} FROM unnest(%(v)s::text[]) WITH ORDINALITY AS o(aggregatetype, i)").format(
            k=sql.Literal(k), topic=m.topic("o")
        )
        for k, m in accepted.items()
    ]
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(sql.SQL(" UNION ALL ").join(parts), {"v": values}).fetchall()
    relay = {(k, i - 1): topic for k, i, topic in rows}
    wrong = []
    for k in accepted:
        regex, replacement = corpus[k]
        javas = java[k * len(values) : (k + 1) * len(values)]
        if None in javas:
            wrong.append(f"{regex!r} / {replacement!r} is accepted, but Java refuses it")
            continue
        for j, value in enumerate(values):
            if relay[(k, j)] != javas[j]:
                wrong.append(f"{regex!r} -> {replacement!r} on {value!r}: relay {relay[(k, j)]!r}, Java {javas[j]!r}")
    return wrong, relay


@pytest.mark.integration
def test_routing_equals_javas_regex_router_or_the_pattern_is_refused(pg_dsn: str, tmp_path: Path) -> None:
    corpus = [(regex, replacement) for regex, replacement, _ in CORPUS]
    accepted, refused = _accept(corpus)
    wrong, relay = _differences(pg_dsn, tmp_path, corpus, accepted, VALUES)
    assert not wrong, "\n".join(wrong)
    for k, (regex, _, want) in enumerate(CORPUS):  # what the issue requires to be accepted or refused
        if want is not None:
            assert (k in accepted) == want, f"{regex!r}: {'accepted' if k in accepted else refused[k]}"
    for k, why in refused.items():  # a refusal names the option, the value and a fix
        assert why.startswith(f"eventRouter.route.topic.regex: {CORPUS[k][0]!r}") and "; fix: " in why, why
    # Defect 4's example: Java (and now the relay) route orders by its word boundaries.
    k = next(k for k, c in enumerate(CORPUS) if c[0] == "\\b(?<a>\\w+)\\b")
    assert relay[(k, VALUES.index("orders"))] == "p.orders"
    assert len(accepted) >= 35 and len(refused) >= 15, (len(accepted), len(refused))


def _random_pattern(rnd: random.Random, depth: int = 0) -> str:
    r = rnd.random()
    if r < 0.12 and depth < 2:
        inner = "".join(_random_pattern(rnd, depth + 1) for _ in range(rnd.randint(1, 3)))
        return rnd.choice(["(", "(?:", f"(?<g{rnd.randint(0, 99)}>"]) + inner + ")"
    if r < 0.18:
        return "(" + "|".join(rnd.sample(["ab", "ba", "c", "a.", "bb", "a"], rnd.randint(2, 3))) + ")"
    if r < 0.24:
        return rnd.choice(["\\b", "\\B", "^", "$"])
    atom = rnd.choice(["a", "b", "\\.", ".", "[ab]", "[^a]", "\\w", "\\W", "\\d", "[a.]", "é", "[a-c]", "\\s", "-"])
    return atom + rnd.choice(["", "", "?", "*", "+", "{0,2}", "{1,2}", "{2}", "{2,}", "*?", "++"])


@pytest.mark.integration
def test_random_patterns_route_as_java_or_are_refused(pg_dsn: str, tmp_path: Path) -> None:
    # Beyond the hand-written corpus: seeded random compositions of the accepted constructs (and some that
    # are refused), over short values of the characters they treat differently.
    rnd = random.Random(44)
    corpus: list[tuple[str, str]] = []
    for _ in range(600):
        regex = "".join(_random_pattern(rnd) for _ in range(rnd.randint(1, 5)))
        groups = regex.count("(") - regex.count("(?:")
        corpus.append((regex, "x" + "".join(f"[${g}]" for g in range(1, min(groups, 9) + 1)) + "$0"))
    alphabet = ["a", "b", ".", "c", "é", "1", " ", "-", "\n"]
    values = [""] + ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 6))) for _ in range(60)]
    accepted, _ = _accept(corpus)
    wrong, relay = _differences(pg_dsn, tmp_path, corpus, accepted, values)
    assert not wrong, "\n".join(wrong[:50])
    routed = sum(1 for (k, j), topic in relay.items() if topic != values[j])
    assert len(accepted) >= 200 and routed >= 500, (len(accepted), routed)  # the corpus is not degenerate


def test_a_possessive_quantifier_is_refused_at_config_load_naming_option_value_and_fix() -> None:
    # Defect 2: Java and Python's re take it; Postgres refused it at every page read, forever.
    with pytest.raises(ConfigError) as err:
        EventRouter.from_options({"route.topic.regex": "(?<routedByValue>[a-z]++)"})
    said = str(err.value)
    assert said.startswith("eventRouter.route.topic.regex: '(?<routedByValue>[a-z]++)'")
    assert "possessive quantifier '++'" in said and "fix: use the greedy '+'" in said


def test_longest_alternative_differences_are_refused() -> None:
    # Defect 4: Postgres routed abcd to p.ab.c.d, Java to p.a.bcd.
    with pytest.raises(ConfigError, match=r"alternation '\|'.*'a' is a prefix of 'ab'.*fix:"):
        EventRouter.from_options(
            {"route.topic.regex": "(?<a>a|ab)(?<b>c|bcd)(?<d>d*)", "route.topic.replacement": "p.${a}.${b}.${d}"}
        )
    with pytest.raises(ConfigError, match=r"alternation '\|'.*plain non-empty literal strings.*fix:"):
        EventRouter.from_options({"route.topic.regex": "(?<routedByValue>[a-z]+|x)"})


# A pattern Java and the translation accept but Postgres' engine does not compile (too many states).
_TOO_COMPLEX = "(?<routedByValue>" + "[a-z]{1,255}" * 400 + ")"


@pytest.mark.integration
def test_a_pattern_postgres_refuses_fails_check_init_db_and_the_relay_start(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox_event"
    init_db(pg_dsn, table, mapping=table_mapping("debezium", {}))
    bad = table_mapping("debezium", {"route.topic.regex": _TOO_COMPLEX})  # config load cannot know
    for mapping in (bad, DebeziumMapping(EventRouter(route_topic_regex="(?<routedByValue>[a-z]++)"))):
        cfg = HarvestConfig(
            data_source=pg_dsn,
            outbox_table=table,
            table_mapping=mapping,
            base_kafka_config={"bootstrap.servers": "localhost:1"},
        )  # type: ignore[call-arg]
        with psycopg.connect(pg_dsn) as conn:
            findings = check_outbox(conn, cfg)
        assert findings[0].level == "FAIL" and "eventRouter.route.topic.regex" in findings[0].message, findings
        with pytest.raises(SchemaError, match=r"eventRouter\.route\.topic\.regex: .*fix: "):
            Harvest(cfg, _ignore).core.open()
        with pytest.raises(SchemaError, match=r"eventRouter\.route\.topic\.regex"):
            init_db(pg_dsn, table, mapping=mapping)
    with psycopg.connect(pg_dsn) as conn:
        names = OutboxNames.parse(table, bad)
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.outbox)).fetchone() == (0,)


_ignore: Callable[[object], None] = lambda e: None  # noqa: E731


@pytest.mark.integration
def test_routing_runs_under_collation_c_whatever_the_columns(pg_dsn: str, pg_schema: str) -> None:
    # Postgres refuses regular expressions under a nondeterministic collation, and a locale's classes
    # are not Java's: the relay routes the column's text under "C".
    m = table_mapping("debezium", {"route.topic.regex": "(?<a>[a-z]+)\\.(?<b>.*)", "route.topic.replacement": P})
    assert isinstance(m, DebeziumMapping)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(
            sql.SQL(
                "CREATE COLLATION {s}.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
            ).format(s=sql.Identifier(pg_schema))
        )
        conn.execute(
            sql.SQL("CREATE TABLE {s}.t (aggregatetype text COLLATE {s}.ci)").format(s=sql.Identifier(pg_schema))
        )
        conn.execute(sql.SQL("INSERT INTO {s}.t VALUES ('orders.x'), ('Orders.x')").format(s=sql.Identifier(pg_schema)))
        got = conn.execute(
            sql.SQL("SELECT {} FROM {}.t AS o ORDER BY 1").format(m.topic("o"), sql.Identifier(pg_schema))
        ).fetchall()
    assert got == [("Orders.x",), ("p.orders",)]
