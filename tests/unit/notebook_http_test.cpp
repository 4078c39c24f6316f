// notebook-http's pure parts: the annotation parser (Kernel Gateway's cell/parser.py), endpoint
// order and path matching, the REQUEST bundle in json.dumps' exact form, the seed notebook
// reader, and hostile notebooks and requests (bounded, refused with a reason).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cellgate/notebook_http/annotations.hpp"
#include "cellgate/notebook_http/notebook.hpp"
#include "cellgate/notebook_http/request.hpp"
#include "cellgate/notebook_http/service.hpp"

namespace cellgate::notebook_http {
namespace {

using nlohmann::ordered_json;

TEST(NotebookHttpAnnotations, RecognisesEndpointsAndResponseInfo) {
  auto a = annotation_of("# GET /hello/:name\nprint(1)", "#");
  EXPECT_EQ(a.kind, Annotation::Kind::kEndpoint);
  EXPECT_EQ(a.verb, "GET");
  EXPECT_EQ(a.path, "/hello/:name");
  a = annotation_of("#   DELETE\t/people/:index  \r\nx", "#");
  EXPECT_EQ(a.kind, Annotation::Kind::kEndpoint);
  EXPECT_EQ(a.verb, "DELETE");
  EXPECT_EQ(a.path, "/people/:index");
  a = annotation_of("# ResponseInfo POST /created\nprint('{}')", "#");
  EXPECT_EQ(a.kind, Annotation::Kind::kResponseInfo);
  EXPECT_EQ(a.verb, "POST");
  EXPECT_EQ(a.path, "/created");
  // Python's \s+ spans lines: "#\nGET /x" is an endpoint for Kernel Gateway too.
  EXPECT_EQ(annotation_of("#\nGET /x", "#").kind, Annotation::Kind::kEndpoint);
  EXPECT_EQ(annotation_of("// GET /scala", "//").path, "/scala");
}

TEST(NotebookHttpAnnotations, RefusesWhatKernelGatewayDoesNotMatch) {
  for (const char* source :
       {"#GET /x", "# get /x", "# PATCH /x", "# GET x", "# GETX /x", " # GET /x", "x = 1\n# GET /x",
        "# GET", "", "#", "# ResponseInfo", "# ResponseInfoGET /x", "# ResponseInfo GET"}) {
    EXPECT_EQ(annotation_of(source, "#").kind, Annotation::Kind::kNone) << source;
  }
  EXPECT_EQ(annotation_of("# GET /x", "//").kind, Annotation::Kind::kNone);
}

TEST(NotebookHttpAnnotations, JoinsCellsAndOrdersEndpointsAsKernelGateway) {
  // endpoint_ordering.ipynb's paths, shuffled: constants first, then by the first parameter's
  // depth, deepest first, ties in notebook order.
  std::vector<std::string> cells = {"import json",
                                    "# GET /:id\n1",
                                    "# GET /t/:id\n2",
                                    "# GET /test/:id\n3",
                                    "# GET /test/test/:id\n4",
                                    "# GET /test/test/test/test\n5",
                                    "# GET /t/t/:id\n6",
                                    "# GET /test/test/test/:id\n7",
                                    "# GET /multi\nx = 1",
                                    "# GET /multi\nprint(x)",
                                    "# ResponseInfo GET /multi\nprint('{}')",
                                    "y = 2",
                                    "# ResponseInfo GET /nowhere\nprint('{}')"};
  auto api = parse_api(cells, "#");
  ASSERT_TRUE(api) << api.error().message;
  std::vector<std::string> order;
  for (const auto& e : api->endpoints) {
    order.push_back(e.path);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"/test/test/test/test", "/multi",
                                             "/test/test/test/:id", "/test/test/:id", "/t/t/:id",
                                             "/t/:id", "/test/:id", "/:id"}));
  const Endpoint& multi = api->endpoints[1];
  EXPECT_EQ(multi.sources.at("GET"), "# GET /multi\nx = 1\n# GET /multi\nprint(x)\n");
  EXPECT_EQ(multi.response_sources.at("GET"), "# ResponseInfo GET /multi\nprint('{}')\n");
  EXPECT_EQ(api->seed_cells, (std::vector<std::string>{"import json", "y = 2"}));
  EXPECT_EQ(api->orphan_responses, (std::vector<std::string>{"/nowhere"}));
}

TEST(NotebookHttpAnnotations, MatchesPathsAndDecodesParameters) {
  auto api =
      parse_api({"# GET /hello/:name\n", "# GET /a/b:rest/c\n", "# GET /caf\xc3\xa9\n"}, "#");
  ASSERT_TRUE(api);
  // Constants first, then ties (both at depth 1) in notebook order.
  const Endpoint& hello = api->endpoints[1];
  ASSERT_EQ(hello.path, "/hello/:name");
  auto m = match_path(hello, "/hello/w%C3%B6rld%2Fx+y");
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)[0], (std::pair<std::string, std::string>{"name", "w\xc3\xb6rld/x+y"}));
  EXPECT_FALSE(match_path(hello, "/hello/"));
  EXPECT_FALSE(match_path(hello, "/hello"));
  EXPECT_FALSE(match_path(hello, "/hello/a/b"));
  EXPECT_FALSE(match_path(hello, "/hello/a/"));
  EXPECT_FALSE(match_path(hello, "//hello/a"));
  const Endpoint& mid = api->endpoints[2];
  auto r = match_path(mid, "/a/bXYZ/c");
  ASSERT_TRUE(r);
  EXPECT_EQ((*r)[0].second, "XYZ");
  EXPECT_FALSE(match_path(mid, "/a/b/c"));
  // A non-ASCII literal path matches its percent-encoded form (Kernel Gateway's never does).
  EXPECT_TRUE(match_path(api->endpoints[0], "/caf%C3%A9"));
  EXPECT_FALSE(match_path(api->endpoints[0], "/cafe"));
}

TEST(NotebookHttpAnnotations, HostileNotebooksAreRefusedOrBounded) {
  EXPECT_FALSE(parse_api({"# GET /a/:"}, "#"));
  EXPECT_FALSE(parse_api({"# GET /a/:b-c"}, "#"));
  EXPECT_FALSE(parse_api({"# GET /:x/:x"}, "#"));
  std::string deep = "# GET ";
  for (int i = 0; i < 100; ++i) {
    deep += "/a";
  }
  EXPECT_FALSE(parse_api({deep}, "#"));
  std::vector<std::string> many;
  for (std::size_t i = 0; i <= kMaxEndpoints; ++i) {
    many.push_back("# GET /e" + std::to_string(i));
  }
  auto refused = parse_api(many, "#");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("endpoint"), std::string::npos);
  // A 10 MB first line is read once.
  std::string long_line = "# GET /" + std::string(10u << 20, 'x');
  auto big = parse_api({long_line}, "#");
  ASSERT_TRUE(big);
  EXPECT_TRUE(match_path(big->endpoints[0], "/" + std::string(10u << 20, 'x')));
}

TEST(NotebookHttpRequest, DumpsAsPythonJsonDumps) {
  ordered_json v = ordered_json::parse(
      R"({"b": [1, 2.5, true, null], "a": "h\u00e9\ud83d\ude00\n\"\\\u0001\u007f"})");
  EXPECT_EQ(python_json(v),
            R"({"b": [1, 2.5, true, null], "a": "h\u00e9\ud83d\ude00\n\"\\\u0001\u007f"})");
  EXPECT_EQ(python_json(ordered_json::object()), "{}");
  EXPECT_EQ(python_json(ordered_json::array()), "[]");
  EXPECT_EQ(python_json(ordered_json(std::string("bad \xff"))), "\"bad \\ufffd\"");
  // Deep values are written without recursion.
  ordered_json deep = ordered_json::array();
  ordered_json* at = &deep;
  for (int i = 0; i < 100000; ++i) {
    at->push_back(ordered_json::array());
    at = &at->back();
  }
  EXPECT_EQ(python_json(deep).size(), 200002u);
}

TEST(NotebookHttpRequest, QueryStringsAreListsAndBodiesFollowTheContentType) {
  auto q = parse_query("a=1&b=&a=x+y%21&c&=e&&d=%C3%A9");
  ASSERT_TRUE(q);
  EXPECT_EQ(python_json(*q),
            R"({"a": ["1", "x y!"], "b": [""], "c": [""], "": ["e"], "d": ["\u00e9"]})");
  EXPECT_FALSE(parse_query("a=%FF"));

  EXPECT_EQ(python_json(*parse_body("application/json", R"({"z": 1, "a": [2]})")),
            R"({"z": 1, "a": [2]})");
  EXPECT_EQ(python_json(*parse_body("application/json", "{not json")), R"("{not json")");
  EXPECT_EQ(python_json(*parse_body("application/json; charset=utf-8", "[1]")), R"("[1]")");
  EXPECT_EQ(python_json(*parse_body("application/x-www-form-urlencoded", "a=1&a=2&b=c+d")),
            R"({"a": ["1", "2"], "b": ["c d"]})");
  EXPECT_EQ(python_json(*parse_body("text/plain", "")), R"("")");
  std::string deep(300, '[');
  deep += std::string(300, ']');
  EXPECT_EQ(python_json(*parse_body("application/json", deep)).size(), deep.size() + 2);
  const std::string multipart =
      "--XX\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\nvalue one\r\n"
      "--XX\r\nContent-Disposition: form-data; name=\"up\"; filename=\"a.txt\"\r\n"
      "Content-Type: text/plain\r\n\r\nfile\r\n--XX--\r\n";
  EXPECT_EQ(python_json(*parse_body("multipart/form-data; boundary=XX", multipart)),
            R"({"f": ["value one"]})");
  EXPECT_EQ(python_json(*parse_body("multipart/form-data", multipart)), "{}");
  EXPECT_FALSE(parse_body("text/plain", "\xc3"));
}

TEST(NotebookHttpRequest, TheBundleAndTheStatement) {
  http::Request req{http::Verb::post, "/echo/1?x=2", 11};
  req.insert("content-type", "application/json");
  req.insert("X-CUSTOM-header", "one");
  req.insert("x-custom-HEADER", "two");
  req.insert("X-Latin", "\xc3\xa9");
  req.body() = R"({"k": "v"})";
  auto bundle = request_bundle(req, {{"a", "1"}});
  ASSERT_TRUE(bundle) << bundle.error().message;
  EXPECT_EQ(python_json(*bundle),
            R"({"body": {"k": "v"}, "args": {"x": ["2"]}, "path": {"a": "1"}, "headers": )"
            R"({"Content-Type": "application/json", "X-Custom-Header": ["one", "two"], )"
            R"("X-Latin": "\u00c3\u00a9"}})");
  EXPECT_EQ(request_code(ordered_json::parse(R"({"a": "\u00e9"})"), "python"),
            R"(REQUEST = "{\"a\": \"\\u00e9\"}")");
  EXPECT_EQ(request_code(ordered_json::object(), "Perl"), R"(my $REQUEST = "{}")");
  EXPECT_EQ(header_case("x-FOO-bar"), "X-Foo-Bar");
}

TEST(NotebookHttpNotebook, ReadsAndRefuses) {
  auto nb = parse_notebook("/srv/h\xc3\xa9llo.api.ipynb", R"nb({"nbformat": 4, "nbformat_minor": 5,
    "metadata": {"kernelspec": {"name": "python3"}, "language_info": {"name": "python"}},
    "cells": [{"cell_type": "markdown", "source": "# GET /md"},
              {"cell_type": "code", "source": ["# GET /a\n", "print(1)"]}]
})nb");
  ASSERT_TRUE(nb) << nb.error().message;
  EXPECT_EQ(nb->kernel_name, "python3");
  EXPECT_EQ(nb->language, "python");
  EXPECT_EQ(nb->code_cells, (std::vector<std::string>{"# GET /a\nprint(1)"}));
  EXPECT_EQ(nb->all_cells.size(), 2u);
  EXPECT_EQ(notebook_title(nb->path), "h\xc3\xa9llo");
  EXPECT_EQ(notebook_title("weirdly%20named#notebook.ipynb"), "weirdly%20named#notebook");
  EXPECT_EQ(notebook_title(".hidden"), ".hidden");
  // Markdown cells count in the Swagger spec, as in Kernel Gateway's.
  EXPECT_EQ(swagger_json(*nb, "#"),
            R"({"swagger": "2.0", "paths": {"/md": {"get": {"responses": {"200": {"description": )"
            R"("Success"}}}}, "/a": {"get": {"responses": {"200": {"description": "Success"}}}}}, )"
            R"("info": {"version": "0.0.0", "title": "h\u00e9llo"}})");
  for (const char* bad : {"", "[]", R"({"nbformat": 3, "cells": []})", R"({"nbformat": 4})",
                          R"({"nbformat": 4, "cells": [{"cell_type": "code", "source": 1}]})",
                          R"({"nbformat": 4, "cells": [{"cell_type": "code", "source": [1]}]})"}) {
    EXPECT_FALSE(parse_notebook("x.ipynb", bad)) << bad;
  }
  std::string deep = R"({"nbformat": 4, "cells": [], "metadata": )" + std::string(100000, '[');
  EXPECT_FALSE(parse_notebook("deep.ipynb", deep));
  EXPECT_FALSE(parse_notebook("huge.ipynb", std::string(kMaxNotebookBytes + 1, ' ')));
  EXPECT_FALSE(load_notebook("/nonexistent/x.ipynb"));
}

}  // namespace
}  // namespace cellgate::notebook_http
