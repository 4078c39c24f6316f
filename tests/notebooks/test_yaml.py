"""`cellgate run -f/-y` against PyYAML: the YAML parameters cellgate reads (libyaml, composed as
PyYAML's safe_load in notebooks/src/yaml.cpp) against what papermill gets from PyYAML's
SafeLoader without timestamps, through `cellgate run --prepare-only`, which writes the injected
cell and metadata.papermill.parameters without starting a kernel.

    CELLGATE_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q -p no:cacheprovider \
        tests/notebooks/test_yaml.py

For each document of the corpus: the injected cell is papermill's (papermill_rules.py, over the
real PyYAML) character for character, and metadata.papermill.parameters holds the same values
(cellgate writes NaN and the infinities as null and ints past 64 bits as floats, JSON having
neither). Documents PyYAML refuses are usage errors (exit 2) naming the line and column. Hostile
documents (a billion laughs, 10,000 open brackets, 10 MB scalars) end with a clear error or the
value, within the test's bound on each run.
"""

import json
import math

import pytest
import yaml

from conftest import cellgate_run, read_notebook, tagged, write_notebook
from papermill_rules import NoDatesLoader, papermill_cell, papermill_values

# Mappings of Python names to values, as -f files.
CORPUS = [
    # From the unit tests (tests/notebooks/run_notebook_test.cpp) and test_run.py.
    '{"items": [1, "a", null, true], "d": {"k": 1.5}, "s": "x\\"y"}',
    '{"x": 1e3}',
    "a: 1\nb: 2.50\nc: yes\nd: off\ne: ~\nf:\ng: South # a comment\n",
    "---\noct: 0755\nhex: 0x1F\nbin: 0b101\nsix: 1:30\nbig: 123456789012345678901\n",
    "f: .inf\ng: -.Inf\nh: .NaN\ni: 1.0e+3\nj: 1_000.5\n",
    "date: 2024-01-02\nq: '007'\nr: \"tab\\there\"\ns: 'it''s'\n",
    "l: [1, two, {k: v}]\nm: {1: a, true: b}\nn: {null: x, 2.5: y}\n",
    "cfg:\n  depth: 2\n  names:\n    - a\n    - b\nlist:\n- x: 1\n  y: 2\n- 3\n",
    "a: 1\nb: 2\na: 3\n",
    "",
    "# only a comment\n",
    "~\n",
    '{"q": [1, "x", null, 1.5], "s": {"k": false}, "t": 1e3}',
    "u: 0755\nv: 2024-01-02\nw: yes\nx: 'it''s'\nz:\n  - a\n  - 1:30\na: 99\n",
    "b: from-file\nnested:\n  k: [1, 2.5]\na: 7\n",
    "n: 0x10\nf: 2.5\nb: yes\nz: ~\ns: 'x'\nl: [1, {k: .inf}]\n"
    "big: 123456789012345678901234567890\n",
    # YAML 1.1 booleans and nulls in their spellings, and what is not one.
    "a: yes\nb: No\nc: ON\nd: off\ne: True\nf: FALSE\ng: y\nh: n\ni: tRUE\nj: oN\nk: Off\n",
    "a: ~\nb: null\nc: Null\nd: NULL\ne:\nf: nUll\ng: ''\nh: \"\"\ni: None\n",
    # Ints: hex, 0o (a string in YAML 1.1), leading-0 octal, underscores, signs, base 60.
    "a: 0x1F\nb: 0o17\nc: 012\nd: 1_000\ne: -0x_ff\nf: +12\ng: -0\nh: 09\ni: 0b1_0\n"
    "j: 190:20:30\nk: 1_\nl: 00\nm: 0_7\nn: 0xDeadBeef\no: 0b\np: 0x\n",
    "a: 123456789012345678901234567890\nb: 0x123456789abcdef0123456789\n"
    "c: -9223372036854775809\nd: 18446744073709551615\ne: 18446744073709551616\n"
    "f: 9223372036854775807\ng: -9223372036854775808\n",
    # Floats: YAML 1.1 wants a dot and a signed exponent; .inf, .nan; base 60.
    "a: 1e3\nb: .5\nc: -.inf\nd: .NaN\ne: 1.0e+3\nf: 6.8523015e+5\ng: 685.230_15e+03\n"
    "h: 190:20:30.15\ni: 0.\nj: -0.0\nk: +.inf\nl: 1.e-3\nm: 1.0e3\nn: 3.14159265358979323846\n"
    "o: 1e400\np: 1.0e+400\nq: 08.5\nr: .INF\ns: 0.1\nt: 1.0e-400\nu: 123456789012345678.0\n",
    "a: [.nan, .inf, -.inf, 1.5, -0.0, 1e16, 1.0e+16, 0.0001, 0.00001]\n",
    # Quoted scalars are strings.
    "a: '1'\nb: \"0x1F\"\nc: 'yes'\nd: \"~\"\ne: '.inf'\nf: \"1.5\"\ng: 'null'\nh: \"\"\n",
    # Multi-line strings: literal and folded block scalars with chomping, plain and quoted
    # scalars over lines, escapes.
    "a: |\n  line 1\n  line 2\nb: >\n  folded\n  text\n\n  para\nc: |-\n  strip\nd: |+\n  keep\n\n"
    "e: plain\n  continued\n  lines\nf: \"double\n  quoted\"\ng: 'single\n\n  quoted'\n"
    "h: >-\n   indented\n    more\n   back\n",
    'a: "\\x41\\u00e9\\U0001F600\\t\\n\\\\\\"\\0\\a\\e\\N\\_\\L\\P\\/ end"\n'
    "b: 'back\\slash'\nc: say \"hi\"\nd: \"\\r\\v\\f\\b\"\n",
    # Block and flow collections, nested.
    "a: [1, [2, [3, {b: [4]}]]]\nb:\n  - [x, y]\n  - {k: v, l: [1, 2]}\n  -\n    - nested\n"
    "c: {a: {b: {c: {}}}, d: []}\n",
    "outer:\n  inner:\n    deeper:\n      leaf: 1\n  sibling: two\nlast: [a,\n  b,\n  c]\n",
    "a: []\nb: {}\nc: [[]]\nd: [{}]\ne:\n- []\n- {}\n",
    '{\n  "a": [\n    1,\n    2\n  ],\n  "b": {"c": null, "d": [true, false]}\n}\n',
    "seq:\n- a\n- - b\n  - c\n- k: v\n  l: w\n- ? complex\n  : key\n",
    # Unicode.
    "a: héllo ☃ 😀\nb: \"\\u263A\"\nu:\n  ключ: значение\n  日本: 語\nc: 'é'\n",
    # Comments.
    "# head\na: 1 # trailing\n# between\nb: [1, # in a flow\n  2]\nc: 'x # not a comment'\n"
    "d: x#y\ne: \"# quoted\"\n",
    # Documents: markers, directives, CRLF.
    "---\na: 1\n...\n",
    "--- \na: 1\n",
    "%YAML 1.1\n---\na: 1\n",
    "--- {a: 1, b: [2]}\n",
    "a: 1\r\nb: two\r\nc:\r\n  - 3\r\n",
    # Keys: quoted, explicit, and not strings inside a value (Python dict keys: 1 == 1.0 == True).
    "\"a\": 1\n'b': 2\n? c\n: 3\n",
    "a: {1: x, 1.0: y, true: z, null: n, .nan: q, 2.5: r, -0.0: s, 0: t, .inf: u, 1e3: v}\n",
    "a: {0x10: hex, 16: dec, yes: bool, 'yes': str}\n",
    # Anchors, aliases and merge keys.
    "base: &b {x: 1, y: 2}\nderived:\n  <<: *b\n  y: 3\nlist: &l [1, 2]\nagain: *l\n",
    "a: &s str\nb: *s\nc: [*s, *s]\n",
    "m:\n  <<: [{a: 1}, {a: 2, b: 2}]\n  c: 3\nn:\n  a: 0\n  <<: {a: 9, z: 9}\n",
    "d: &d\n  k: &k [1, {x: y}]\ne: *k\nf: *d\n",
    # Tags safe_load knows, and the non-specific '!'.
    "a: !!str 1\nb: !!int \"3\"\nc: !!float \"1\"\nd: ! 3\ne: !!bool yes\nf: !!null x\n"
    "g: !!seq [1]\nh: !!map {k: v}\ni: !!str\nj: !!float 1.5\nk: !!int 0x1F\n",
    # Plain scalars that look like indicators, and dates that stay strings.
    "a: -dash\nb: :colon\nc: a:b\nd: 2001-12-14t21:59:43.10-05:00\ne: 2002-12-14\nf: ?q\n"
    "g: x - y\nh: http://example.com/a?b=c#d\ni: '@at'\nj: '`tick'\nk: 12:30:45\n",
]

# Documents PyYAML refuses: a usage error naming where.
REFUSED = [
    "a: [1, 2\n",
    "a: 1\n---\nb: 2\n",
    "a: *nope\n",
    "a: &x 1\nb: &x 2\n",
    "a: {[1]: 2}\n",
    "a: !!python/object:os.system x\n",
    "a: b: c\n",
    "\ta: 1\n",
    "a: <<\n",
    "a: !!int abc\n",
    "a: \"unclosed\n",
    "a:\n  - 1\n  b: 2\n",
    "a: 0b_\n",
    "a: 1\n b: 2\n",
    "m:\n  <<: [1, 2]\n",
]


@pytest.fixture(scope="module")
def notebook(tmp_path_factory):
    d = tmp_path_factory.mktemp("yaml")
    return write_notebook(d / "in.ipynb", [tagged("a = 0", "parameters"), "print(a)"])


def prepare(notebook, tmp_path, text, name="case.yaml"):
    """`cellgate run --prepare-only -f FILE` with `text` in FILE: (process, notebook or None)."""
    params = tmp_path / name
    params.write_text(text, encoding="utf-8", newline="")
    out = tmp_path / ("out-" + name + ".ipynb")
    proc = cellgate_run(notebook, "-o", out, "--prepare-only", "-f", params)
    return proc, (read_notebook(out) if proc.returncode == 0 else None)


def as_metadata(value):
    """What cellgate writes in metadata.papermill.parameters for a safe_load value: json.dumps's
    keys, NaN and the infinities null, ints past 64 bits floats."""
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(k): as_metadata(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [as_metadata(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and not (
            -2**63 <= value < 2**64):
        return float(value)
    return value


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_reads_as_pyyaml(notebook, tmp_path, text):
    want = papermill_values(y=[text])
    proc, nb = prepare(notebook, tmp_path, text)
    assert proc.returncode == 0, proc.stderr
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    if not want:
        assert injected == [] and nb.metadata["papermill"]["parameters"] == {}, nb.cells
        return
    assert len(injected) == 1
    assert injected[0].source == papermill_cell(y=[text])
    assert nb.metadata["papermill"]["parameters"] == as_metadata(want)


@pytest.mark.parametrize("text", REFUSED, ids=range(len(REFUSED)))
def test_refuses_what_pyyaml_refuses(notebook, tmp_path, text):
    with pytest.raises((yaml.YAMLError, ValueError)):  # int('', 2) for 0b_
        yaml.load(text, Loader=NoDatesLoader)
    proc, _ = prepare(notebook, tmp_path, text)
    assert proc.returncode == 2, proc.stderr
    assert "-f " in proc.stderr and "line " in proc.stderr, proc.stderr


def test_a_recursive_alias_is_refused(notebook, tmp_path):
    # PyYAML builds a list that contains itself; papermill could not write it.
    proc, _ = prepare(notebook, tmp_path, "a: &x [1, *x]\n")
    assert proc.returncode == 2
    assert "line 1, column 11: the alias *x is inside its own anchor" in proc.stderr, proc.stderr


# ---- hostile documents --------------------------------------------------------------------------

def billion_laughs(levels=9):
    lines = ['l0: &l0 "lol"']
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def test_a_billion_laughs_is_refused(notebook, tmp_path):
    proc, _ = prepare(notebook, tmp_path, billion_laughs())
    assert proc.returncode == 2
    assert "the document makes more than 250000 values (each copy an alias makes counts)" in (
        proc.stderr), proc.stderr


def test_ten_thousand_open_brackets_are_refused(notebook, tmp_path):
    proc, _ = prepare(notebook, tmp_path, "a: " + "[" * 10000 + "]" * 10000 + "\n")
    assert proc.returncode == 2
    assert "line 1, column 259: nested deeper than 256 levels" in proc.stderr, proc.stderr
    proc, _ = prepare(notebook, tmp_path, "a: " + "[" * 10000 + "\n", "unclosed.yaml")
    assert proc.returncode == 2 and "nested deeper than 256 levels" in proc.stderr, proc.stderr


def test_a_ten_megabyte_scalar_is_read(notebook, tmp_path):
    big = "x" * (10 << 20)
    proc, nb = prepare(notebook, tmp_path, f"a: {big}\nb: '{big}'\n")
    assert proc.returncode == 0, proc.stderr[:2000]
    assert nb.cells[1].source == f'# Parameters\na = "{big}"\nb = "{big}"\n'
    assert nb.metadata["papermill"]["parameters"] == {"a": big, "b": big}


def test_aliases_of_a_ten_megabyte_scalar_are_bounded(notebook, tmp_path):
    big = "x" * (10 << 20)
    proc, _ = prepare(notebook, tmp_path, f"a: &a {big}\nb: [*a, *a, *a, *a, *a, *a, *a]\n")
    assert proc.returncode == 2
    assert "line 2, column 25: aliases copy more than 64 MiB of text" in proc.stderr, proc.stderr


def test_a_ten_megabyte_int_is_refused(notebook, tmp_path):
    # Python's int() and str() stop at 4300 digits: papermill could not write it either.
    with pytest.raises(ValueError):
        yaml.load("a: " + "7" * 5000, Loader=NoDatesLoader)
    proc, _ = prepare(notebook, tmp_path, "a: " + "7" * (10 << 20) + "\n")
    assert proc.returncode == 2
    assert "an int of more than 4300 digits (Python cannot write one)" in proc.stderr, proc.stderr
