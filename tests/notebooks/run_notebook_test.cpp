// nbformat handling of `cellgate run` (notebooks/src/notebook.cpp): validation messages,
// -p values as Python literals, the injected-parameters cell, artifacts of an output.
#include "cellgate/notebooks/notebook.hpp"

#include <gtest/gtest.h>

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

json notebook_of(json cells, int minor = 5) {
  return json{{"nbformat", 4},
              {"nbformat_minor", minor},
              {"metadata", json::object()},
              {"cells", std::move(cells)}};
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

std::string python(const std::string& arg) {
  auto p = parse_parameter(arg);
  return p ? p->name + " = " + p->python : "error: " + p.error().message;
}

TEST(RunNotebook, ParameterValuesArePythonLiteralsWhenTheyAreOne) {
  EXPECT_EQ(python("n=3"), "n = 3");
  EXPECT_EQ(python("n=-12345678901234567890123"), "n = -12345678901234567890123");
  EXPECT_EQ(python("x=0.5"), "x = 0.5");
  EXPECT_EQ(python("x=1e3"), "x = 1000.0");
  EXPECT_EQ(python("b=True"), "b = True");
  EXPECT_EQ(python("b=false"), "b = False");
  EXPECT_EQ(python("v=None"), "v = None");
  EXPECT_EQ(python("v=null"), "v = None");
  EXPECT_EQ(python("s=South"), "s = 'South'");
  EXPECT_EQ(python("s=\"quoted\""), "s = 'quoted'");
  EXPECT_EQ(python("s='single'"), "s = 'single'");
  EXPECT_EQ(python("s=it's"), "s = \"it's\"");
  EXPECT_EQ(python("s=a'b\"c\\"), "s = 'a\\'b\"c\\\\'");
  EXPECT_EQ(python("s=line\nbreak"), "s = 'line\\nbreak'");
  EXPECT_EQ(python("s=007"), "s = '007'");
  EXPECT_EQ(python("s="), "s = ''");
  EXPECT_EQ(python("l=[1, \"a\", true, null]"), "l = [1, 'a', True, None]");
  EXPECT_EQ(python("d={\"k\": [1.5]}"), "d = {'k': [1.5]}");
  EXPECT_EQ(python("u=héllo"), "u = 'héllo'");
  EXPECT_EQ(python("eq=a=b"), "eq = 'a=b'");
}

TEST(RunNotebook, ParameterNamesMustBePythonNames) {
  EXPECT_FALSE(parse_parameter("novalue"));
  EXPECT_FALSE(parse_parameter("=1"));
  EXPECT_FALSE(parse_parameter("1x=1"));
  EXPECT_FALSE(parse_parameter("a-b=1"));
  EXPECT_FALSE(parse_parameter("lambda=1"));
  EXPECT_TRUE(parse_parameter("_private=1"));
}

TEST(RunNotebook, InjectsAfterTheParametersCellAndReplacesAnOldInjection) {
  json nb = notebook_of({code_cell("import x"), code_cell("a = 1", json::array({"parameters"})),
                         code_cell("a = 5", json::array({"injected-parameters"})),
                         code_cell("print(a)")});
  auto where = inject_parameters(nb, {{"a", "2"}, {"b", "'x'"}});
  EXPECT_TRUE(where.after_parameters_cell);
  EXPECT_EQ(where.index, 2u);
  ASSERT_EQ(nb["cells"].size(), 4u);
  const json& cell = nb["cells"][2];
  EXPECT_TRUE(has_tag(cell, "injected-parameters"));
  EXPECT_EQ(source_of(cell), "# Parameters\na = 2\nb = 'x'");
  EXPECT_TRUE(cell.contains("id"));
  EXPECT_EQ(source_of(nb["cells"][3]), "print(a)");
  EXPECT_TRUE(validate(nb));
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
