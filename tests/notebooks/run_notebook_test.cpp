// nbformat handling of `cellgate run` (notebooks/src/notebook.cpp): validation messages, the
// injected-parameters cell, artifacts of an output; and papermill's -p / -r / -y
// (notebooks/src/parameters.cpp), checked against what papermill's _resolve_type and
// PythonTranslator give for the same input.
#include <gtest/gtest.h>

#include "cellgate/notebooks/notebook.hpp"
#include "cellgate/notebooks/parameters.hpp"
#include "cellgate/util/text.hpp"

namespace cellgate::notebooks::notebook {
namespace {

using nlohmann::json;

json code_cell(const std::string& source, json tags = json::array()) {
  return json{{"cell_type", "code"},
              {"execution_count", nullptr},
              {"metadata", {{"tags", std::move(tags)}}},
              {"outputs", json::array()},
              {"source", source}};
}

// A vector, not a json: `json cells` from `{one_cell}` is that cell with clang and a one-cell
// array with gcc (nlohmann's brace-initialization caveat).
json notebook_of(std::vector<json> cells, int minor = 5) {
  return json{{"nbformat", 4},
              {"nbformat_minor", minor},
              {"metadata", json::object()},
              {"cells", json(std::move(cells))}};
}

std::string error_of(const std::string& text) {
  auto parsed = parse(text);
  return parsed ? std::string("(valid)") : parsed.error().message;
}

TEST(RunNotebook, ValidNotebookParses) {
  json nb = notebook_of({code_cell("1"),
                         {{"cell_type", "markdown"},
                          {"metadata", json::object()},
                          {"source", json::array({"# a\n", "b"})}}});
  auto parsed = parse(nb.dump());
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(source_of((*parsed)["cells"][1]), "# a\nb");
}

TEST(RunNotebook, ErrorsNameTheProblemAndTheCell) {
  EXPECT_NE(error_of("{oops").find("not JSON: parse error at line 1, column 2"), std::string::npos);
  EXPECT_EQ(error_of("[]"), "not a notebook: the top level is a list, not an object");
  EXPECT_NE(error_of(R"({"nbformat": 3, "worksheets": []})").find("nbformat 3 is not supported"),
            std::string::npos);
  EXPECT_EQ(error_of(R"({"nbformat": 4, "nbformat_minor": 4})"), "no 'cells' list");
  json no_source = notebook_of({code_cell("1"), code_cell("2")});
  no_source["cells"][1].erase("source");
  EXPECT_EQ(error_of(no_source.dump()),
            "cells[1] (code): no 'source' (nbformat 4 needs a string or a list of strings)");
  json bad_source = notebook_of({code_cell("1")});
  bad_source["cells"][0]["source"] = json::array({"a", 1});
  EXPECT_EQ(error_of(bad_source.dump()),
            "cells[0] (code): 'source' must be a string or a list of strings, not a list");
  json bad_outputs = notebook_of({code_cell("1")});
  bad_outputs["cells"][0]["outputs"] = json::object();
  EXPECT_EQ(error_of(bad_outputs.dump()),
            "cells[0] (code): 'outputs' must be a list, not an object");
  json bad_count = notebook_of({code_cell("1")});
  bad_count["cells"][0]["execution_count"] = "3";
  EXPECT_EQ(error_of(bad_count.dump()),
            "cells[0] (code): 'execution_count' must be null or an integer, not a string");
  json bad_tags = notebook_of({code_cell("1", json::array({1}))});
  EXPECT_EQ(error_of(bad_tags.dump()), "cells[0] (code): metadata.tags must be a list of strings");
  json heading = notebook_of({{{"cell_type", "heading"}, {"source", "x"}}});
  EXPECT_EQ(error_of(heading.dump()),
            "cells[0]: 'cell_type' is \"heading\", not one of code, markdown, raw");
}

// -p NAME VALUE as `NAME = <what papermill injects>`, or the error.
std::string p(const std::string& name, const std::string& value) {
  auto made = parameters::typed(name, value);
  return made ? made->name + " = " + made->python : "error: " + made.error().message;
}

TEST(RunNotebook, DashPTypesValuesAsPapermill) {
  // papermill's _resolve_type: True/False/None exactly, then int(), then float(), else str.
  EXPECT_EQ(p("n", "3"), "n = 3");
  EXPECT_EQ(p("n", "-12345678901234567890123"), "n = -12345678901234567890123");
  EXPECT_EQ(p("n", "007"), "n = 7");          // int("007") is 7
  EXPECT_EQ(p("n", " +1_000 "), "n = 1000");  // int() strips and takes underscores
  EXPECT_EQ(p("n", "-0"), "n = 0");
  EXPECT_EQ(p("x", "0.5"), "x = 0.5");
  EXPECT_EQ(p("x", "1e3"), "x = 1000.0");
  EXPECT_EQ(p("x", "1e16"), "x = 1e+16");
  EXPECT_EQ(p("x", "1E-5"), "x = 1e-05");
  EXPECT_EQ(p("x", "0.0001"), "x = 0.0001");
  EXPECT_EQ(p("x", "1."), "x = 1.0");
  EXPECT_EQ(p("x", ".5"), "x = 0.5");
  EXPECT_EQ(p("x", "-0.0"), "x = -0.0");
  EXPECT_EQ(p("x", "0.1"), "x = 0.1");
  EXPECT_EQ(p("x", "123456789012345678"), "x = 123456789012345678");
  EXPECT_EQ(p("x", "123456789012345678.0"), "x = 1.2345678901234568e+17");
  EXPECT_EQ(p("x", "inf"), "x = float('inf')");
  EXPECT_EQ(p("x", "-Infinity"), "x = float('-inf')");
  EXPECT_EQ(p("x", "nan"), "x = float('nan')");
  EXPECT_EQ(p("x", "1e999"), "x = float('inf')");
  EXPECT_EQ(p("n", std::string(4301, '1')), "n = float('inf')");  // past int()'s 4300 digits
  EXPECT_EQ(p("b", "True"), "b = True");
  EXPECT_EQ(p("b", "False"), "b = False");
  EXPECT_EQ(p("v", "None"), "v = None");
  // Anything else is a string, in papermill's double quotes through unicode_escape.
  EXPECT_EQ(p("b", "true"), "b = \"true\"");
  EXPECT_EQ(p("v", "null"), "v = \"null\"");
  EXPECT_EQ(p("s", "South"), "s = \"South\"");
  EXPECT_EQ(p("s", "'single'"), "s = \"'single'\"");
  EXPECT_EQ(p("s", "say \"hi\""), "s = \"say \\\"hi\\\"\"");
  EXPECT_EQ(p("s", "a\\b"), "s = \"a\\\\b\"");
  EXPECT_EQ(p("s", "line\nbreak\ttab"), "s = \"line\\nbreak\\ttab\"");
  EXPECT_EQ(p("u", "h\u00e9llo \u2603 \U0001F600"), "u = \"h\\xe9llo \\u2603 \\U0001f600\"");
  EXPECT_EQ(p("s", "1_"), "s = \"1_\"");
  EXPECT_EQ(p("s", ""), "s = \"\"");
  EXPECT_EQ(p("l", "[1, 2]"), "l = \"[1, 2]\"");  // -p does not read JSON: use -y
  EXPECT_EQ(p("e", "a=b"), "e = \"a=b\"");
}

TEST(RunNotebook, DashRIsTheStringAsItIs) {
  auto r = parameters::raw("n", "007");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->python, "\"007\"");
  EXPECT_EQ(parameters::raw("t", "True")->python, "\"True\"");
}

// -y YAML as `a = 1; b = 2`, or the error.
std::string y(const std::string& text) {
  auto made = parameters::yaml(text);
  if (!made) {
    return "error: " + made.error().message;
  }
  std::string out;
  for (const auto& param : *made) {
    out += (out.empty() ? "" : "; ") + param.name + " = " + param.python;
  }
  return out;
}

// Long values and names are matched without recursion (std::regex recursed once per character
// and overflowed the stack on a 100 KB scalar; the fuzzer's inputs were too small to show it).
TEST(RunNotebook, LongScalarsAndNamesDoNotOverflowTheStack) {
  const std::string letters(200000, 'a');
  EXPECT_EQ(y("s: " + letters + "\n"), "s = \"" + letters + "\"");
  const std::string digits(100000, '7');
  const std::string made = y("n: " + digits + "\n");
  EXPECT_TRUE(made.rfind("n = ", 0) == 0 || made.rfind("error: ", 0) == 0) << made.substr(0, 80);
  const std::string name(100000, 'v');
  auto typed = parameters::typed(name, "1");
  ASSERT_TRUE(typed) << typed.error().message;
  EXPECT_EQ(typed->name, name);
  EXPECT_FALSE(parameters::typed(name + "-", "1"));
}

// Issue 24: a notebook is untrusted input. nlohmann parses any depth, but dump(), copies and ==
// recurse once per level: a 100,000-deep notebook was accepted and overflowed the stack when
// the run wrote it. It is refused before it is parsed; application/json outputs as deep as the
// bound leaves room for still read, and write back.
TEST(RunNotebook, ADeeplyNestedNotebookIsRefusedBeforeParsing) {
  const std::size_t deep = 100000;
  const std::string nested = std::string(deep, '[') + std::string(deep, ']');
  const std::string text =
      R"({"nbformat": 4, "nbformat_minor": 5, "cells": [], "metadata": {"deep": )" + nested + "}}";
  EXPECT_EQ(error_of(text), "not a notebook: its JSON nests deeper than 256 levels");
  // Brackets in strings do not count.
  EXPECT_EQ(error_of(notebook_of({code_cell(std::string(deep, '['))}).dump()), "(valid)");

  // An output's application/json as deep as the bound allows: notebook, cells, cell, outputs,
  // output, data are 6 levels.
  json value = json::array();
  for (std::size_t i = 0; i < kMaxDepth - 7; ++i) {
    value = json::array({std::move(value)});
  }
  json nb = notebook_of({code_cell("1")});
  nb["cells"][0]["outputs"] = json::array({{{"output_type", "display_data"},
                                            {"data", {{"application/json", value}}},
                                            {"metadata", json::object()}}});
  auto parsed = parse(dump(nb));
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(*parsed, nb);
  nb["cells"][0]["outputs"][0]["data"]["application/json"] = json::array({value});
  EXPECT_EQ(error_of(dump(nb)), "not a notebook: its JSON nests deeper than 256 levels");
}

// -y's values are copied, rendered and destroyed by recursion: their nesting is bounded as a
// notebook's is (a flow collection, block mappings by indentation, or through an alias).
TEST(RunNotebook, DashYRefusesDeepNesting) {
  const std::size_t deep = 100000;
  EXPECT_EQ(y("{a: " + std::string(deep, '[') + std::string(deep, ']') + "}"),
            "error: -y: line 1, column 260: nested deeper than 256 levels");
  std::string block;
  for (std::size_t i = 0; i < 1000; ++i) {
    block += std::string(i, ' ') + "k:\n";
  }
  // The 257th level.
  EXPECT_EQ(y(block), "error: -y: line 257, column 257: nested deeper than 256 levels");
  EXPECT_EQ(y("a: " + std::string(200, '[') + std::string(200, ']')).substr(0, 8), "a = [[[[");
  const std::string tall = "t: &t " + std::string(200, '[') + std::string(200, ']') + "\n";
  EXPECT_EQ(y(tall + "u: " + std::string(55, '[') + "*t" + std::string(55, ']')).substr(0, 8),
            "t = [[[[");
  EXPECT_EQ(y(tall + "u: " + std::string(56, '[') + "*t" + std::string(56, ']')),
            "error: -y: line 2, column 60: the alias *t nests deeper than 256 levels");
}

// A hostile -y (issue 30): what aliases copy is bounded, and so are ints past what Python can
// write. Each ends at once with the error.
TEST(RunNotebook, DashYBoundsWhatAliasesMake) {
  std::string laughs = "l0: &l0 lol\n";
  for (int i = 1; i <= 9; ++i) {
    laughs += "l" + std::to_string(i) + ": &l" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) {
      laughs += (k == 0 ? "*l" : ", *l") + std::to_string(i - 1);
    }
    laughs += "]\n";
  }
  EXPECT_EQ(y(laughs),
            "error: -y: line 7, column 10: the document makes more than 250000 values (each copy "
            "an alias makes counts)");
  const std::string big(10 << 20, 'x');
  EXPECT_EQ(y("a: &a " + big + "\nb: [*a, *a, *a, *a, *a, *a, *a]\n"),
            "error: -y: line 2, column 25: aliases copy more than 64 MiB of text");
  EXPECT_EQ(y("a: " + big + "\n"), "a = \"" + big + "\"");
  EXPECT_EQ(y("a: &x [1, *x]\n"),
            "error: -y: line 1, column 11: the alias *x is inside its own anchor (a recursive "
            "structure is not supported)");
  EXPECT_EQ(y("a: 0x" + std::string(100000, 'f') + "\n"),
            "error: -y: line 1, column 4: '0x" + std::string(38, 'f') +
                "...': an int of more than 4300 digits (Python cannot write one)");
  EXPECT_EQ(y("a: 0b_\n"), "error: -y: line 1, column 4: '0b_': no digits after 0b");
  const std::string digits(4300, '9');
  EXPECT_EQ(y("a: " + digits + "\n"), "a = " + digits);
}

TEST(RunNotebook, DashYReadsYamlAndJsonAsPyYamlDoes) {
  // JSON (a subset of YAML).
  EXPECT_EQ(y(R"({"items": [1, "a", null, true], "d": {"k": 1.5}, "s": "x\"y"})"),
            R"(items = [1, "a", None, True]; d = {"k": 1.5}; s = "x\"y")");
  EXPECT_EQ(y(R"({"x": 1e3})"), R"(x = "1e3")");  // YAML 1.1: a float needs a dot
  // Block mappings, YAML 1.1 scalars.
  EXPECT_EQ(y("a: 1\nb: 2.50\nc: yes\nd: off\ne: ~\nf:\ng: South # a comment\n"),
            "a = 1; b = 2.5; c = True; d = False; e = None; f = None; g = \"South\"");
  EXPECT_EQ(y("---\noct: 0755\nhex: 0x1F\nbin: 0b101\nsix: 1:30\nbig: 123456789012345678901\n"),
            "oct = 493; hex = 31; bin = 5; six = 90; big = 123456789012345678901");
  EXPECT_EQ(y("f: .inf\ng: -.Inf\nh: .NaN\ni: 1.0e+3\nj: 1_000.5\n"),
            "f = float('inf'); g = float('-inf'); h = float('nan'); i = 1000.0; j = 1000.5");
  EXPECT_EQ(y("date: 2024-01-02\nq: '007'\nr: \"tab\\there\"\ns: 'it''s'\n"),
            "date = \"2024-01-02\"; q = \"007\"; r = \"tab\\there\"; s = \"it's\"");
  // Keys are Python dict keys: true == 1, so the second entry overwrites the first.
  EXPECT_EQ(y("l: [1, two, {k: v}]\nm: {1: a, true: b}\nn: {null: x, 2.5: y}\n"),
            R"(l = [1, "two", {"k": "v"}]; m = {"1": "b"}; n = {"None": "x", "2.5": "y"})");
  // Nested blocks.
  EXPECT_EQ(y("cfg:\n  depth: 2\n  names:\n    - a\n    - b\nlist:\n- x: 1\n  y: 2\n- 3\n"),
            R"(cfg = {"depth": 2, "names": ["a", "b"]}; list = [{"x": 1, "y": 2}, 3])");
  // A repeated key keeps its first place and takes the last value; nothing is no parameters.
  EXPECT_EQ(y("a: 1\nb: 2\na: 3\n"), "a = 3; b = 2");
  EXPECT_EQ(y(""), "");
  EXPECT_EQ(y("# only a comment\n"), "");
  // Anchors, aliases and merge keys; block scalars; safe_load's tags.
  EXPECT_EQ(y("a: &x 1\nb: *x\n"), "a = 1; b = 1");
  EXPECT_EQ(y("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  y: 3\n"),
            R"(base = {"x": 1, "y": 2}; d = {"x": 1, "y": 3})");
  EXPECT_EQ(y("a: |\n  text\nb: >-\n  folded\n  line\n"), R"(a = "text\n"; b = "folded line")");
  EXPECT_EQ(y("s: !!str 1\nn: !!int \"3\"\n"), R"(s = "1"; n = 3)");
  // Errors say where, in libyaml's words or PyYAML's.
  EXPECT_EQ(y("[1, 2]"),
            "error: -y wants a mapping of names to values ('name: value' or "
            "{\"name\": value})");
  EXPECT_EQ(y("1: x"), "error: -y: the key 1 is not a Python variable name");
  EXPECT_EQ(y("{a: [1, 2}"),
            "error: -y: line 1, column 10: did not find expected ',' or ']' (while parsing a "
            "flow sequence at line 1, column 5)");
  EXPECT_EQ(y("a: *x\n"), "error: -y: line 1, column 4: found undefined alias *x");
  EXPECT_EQ(y("a: &x 1\nb: &x 2\n"), "error: -y: line 2, column 4: found duplicate anchor &x");
  EXPECT_EQ(y("a: 1\n---\nb: 2\n"),
            "error: -y: line 2, column 1: expected a single document in the stream, but found "
            "another document");
  EXPECT_EQ(y("a: !!set {}\n"),
            "error: -y: line 1, column 4: the tag !!set is not supported "
            "(safe_load's !!str, !!int, !!float, !!bool, !!null, !!seq and !!map are)");
  EXPECT_EQ(y("a: {[1]: 2}\n"),
            "error: -y: line 1, column 5: found unhashable key (a list or mapping cannot be a "
            "dict key)");
  EXPECT_EQ(y("a: <<\n"), "error: -y: line 1, column 4: a plain '<<' can only be a mapping key");
  EXPECT_EQ(y("a: \"\xff\"\n"), "error: -y: byte 4: invalid leading UTF-8 octet (#FF)");
}

TEST(RunNotebook, ParametersMergeAsPapermillsDictUpdates) {
  auto merged =
      parameters::merge({{{"a", "1"}, {"b", "2"}}}, {{"c", "3"}, {"a", "4"}}, {{"b", "\"raw\""}});
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[0].name + "=" + merged[0].python, "a=4");
  EXPECT_EQ(merged[1].name + "=" + merged[1].python, "b=\"raw\"");
  EXPECT_EQ(merged[2].name + "=" + merged[2].python, "c=3");
}

// metadata.papermill.parameters holds the values as JSON (what Python's json.dumps writes of the
// dict papermill keeps), beside the Python text the cell gets.
TEST(RunNotebook, ParametersCarryTheirJsonValues) {
  auto y = parameters::yaml(
      "n: 0x10\nf: 2.5\nb: yes\nz: ~\ns: 'x'\nl: [1, {k: .inf}]\n"
      "big: 123456789012345678901234567890\n");
  ASSERT_TRUE(y) << y.error().message;
  json values = json::object();
  for (const auto& p : *y) {
    values[p.name] = p.value;
  }
  EXPECT_EQ(values, json::parse(R"({"n": 16, "f": 2.5, "b": true, "z": null, "s": "x",
                                     "l": [1, {"k": null}], "big": 1.2345678901234568e29})"));
  EXPECT_EQ(parameters::typed("a", "007")->value, json(7));
  EXPECT_EQ(parameters::typed("a", "None")->value, json());
  EXPECT_EQ(parameters::typed("a", "1e3")->value, json(1000.0));
  EXPECT_EQ(parameters::typed("a", "hi")->value, json("hi"));
  EXPECT_EQ(parameters::raw("a", "007")->value, json("007"));
  auto merged = parameters::merge({*y}, {*parameters::typed("n", "3")}, {});
  EXPECT_EQ(merged[0].name, "n");
  EXPECT_EQ(merged[0].value, json(3));
}

TEST(RunNotebook, ParameterNamesMustBePythonNames) {
  EXPECT_FALSE(parameters::typed("", "1"));
  EXPECT_FALSE(parameters::typed("1x", "1"));
  EXPECT_FALSE(parameters::typed("a-b", "1"));
  EXPECT_FALSE(parameters::typed("lambda", "1"));
  EXPECT_FALSE(parameters::raw("a b", "1"));
  EXPECT_TRUE(parameters::typed("_private", "1"));
}

TEST(RunNotebook, InjectsAfterTheParametersCellAsPapermill) {
  json nb = notebook_of({code_cell("import x"), code_cell("a = 1", json::array({"parameters"})),
                         code_cell("print(a)")});
  auto where = inject_parameters(nb, {{"a", "2"}, {"b", "\"x\""}});
  EXPECT_TRUE(where.after_parameters_cell);
  EXPECT_EQ(where.index, 2u);
  ASSERT_EQ(nb["cells"].size(), 4u);
  const json& cell = nb["cells"][2];
  EXPECT_TRUE(has_tag(cell, "injected-parameters"));
  // papermill's cell as nbformat writes it: "# Parameters", one line per parameter.
  EXPECT_EQ(cell["source"], json::array({"# Parameters\n", "a = 2\n", "b = \"x\"\n"}));
  EXPECT_EQ(cell["metadata"], (json{{"tags", {"injected-parameters"}}}));
  EXPECT_EQ(cell["outputs"], json::array());
  EXPECT_TRUE(cell.contains("id"));
  EXPECT_EQ(source_of(nb["cells"][3]), "print(a)");
  EXPECT_TRUE(validate(nb));
}

TEST(RunNotebook, ReplacesAnEarlierInjectionWhereItIs) {
  // papermill replaces the first injected-parameters cell in place, wherever it is.
  json nb = notebook_of({code_cell("a = 5", json::array({"injected-parameters"})),
                         code_cell("a = 1", json::array({"parameters"})), code_cell("print(a)")});
  auto where = inject_parameters(nb, {{"a", "2"}});
  EXPECT_EQ(where.index, 0u);
  ASSERT_EQ(nb["cells"].size(), 3u);
  EXPECT_EQ(source_of(nb["cells"][0]), "# Parameters\na = 2\n");
  EXPECT_TRUE(has_tag(nb["cells"][1], "parameters"));
}

TEST(RunNotebook, InjectsFirstWithoutAParametersCell) {
  json nb = notebook_of({code_cell("print(a)")}, 4);
  auto where = inject_parameters(nb, {{"a", "1"}});
  EXPECT_FALSE(where.after_parameters_cell);
  EXPECT_EQ(where.index, 0u);
  EXPECT_FALSE(nb["cells"][0].contains("id"));  // nbformat 4.4 has no cell ids
}

TEST(RunNotebook, FirstLineSkipsBlankLinesAndShortens) {
  EXPECT_EQ(first_line("\n  \n  x = 1  \ny"), "x = 1");
  EXPECT_EQ(first_line(std::string(100, 'a'), 10), "aaaaaaaaaa...");
  EXPECT_EQ(first_line("   "), "");
}

TEST(RunNotebook, ArtifactsOfAnOutput) {
  const std::string png = "\x89PNG\r\n\x1a\n";
  json output = {{"output_type", "display_data"},
                 {"data",
                  {{"image/png", base64_encode(png)},
                   {"image/svg+xml", json::array({"<svg>", "</svg>"})},
                   {"text/plain", "<Figure>"}}},
                 {"metadata", json::object()}};
  auto found = artifacts_of(output);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].extension, "png");
  EXPECT_EQ(found[0].bytes, png);
  EXPECT_EQ(found[1].bytes, "<svg></svg>");
  EXPECT_TRUE(artifacts_of(json{{"output_type", "stream"}, {"text", "x"}}).empty());
}

TEST(RunNotebook, DumpKeepsUtf8AndReplacesInvalidBytes) {
  json nb = notebook_of({code_cell("print('é')")});
  nb["cells"][0]["outputs"] = json::array(
      {{{"output_type", "stream"}, {"name", "stdout"}, {"text", std::string("bad \xff byte")}}});
  const std::string text = dump(nb);
  EXPECT_NE(text.find("print('é')"), std::string::npos);
  EXPECT_NE(text.find("bad \xEF\xBF\xBD byte"), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
}

}  // namespace
}  // namespace cellgate::notebooks::notebook
