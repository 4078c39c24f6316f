// What `cellgate run` prints and writes per notebook (notebooks/src/report.hpp): the summary
// line of each status, and the results CSV's quoting.
#include "report.hpp"

#include <gtest/gtest.h>

namespace cellgate::notebooks {
namespace {

using nlohmann::json;

Job job_at(const std::string& path) {
  Job job;
  job.path = path;
  return job;
}

TEST(Report, SummaryLineOfARunThatWentWell) {
  Outcome o;
  o.code_cells = 5;
  o.executed = 5;
  o.duration_s = 4.591;
  o.artifacts = 1;
  o.output = "/tmp/analysis.ipynb";
  EXPECT_EQ(summary_line(job_at("nb/data_analysis.ipynb"), o),
            "ok      nb/data_analysis.ipynb  5/5 cells  4.59 s  1 artifact  -> "
            "/tmp/analysis.ipynb");
  o.errors = 2;
  o.duration_s = 12.63;
  o.artifacts = 0;
  o.output.clear();
  EXPECT_EQ(summary_line(job_at("a.ipynb"), o),
            "ok      a.ipynb  5/5 cells  2 errors allowed  12.6 s");
}

TEST(Report, SummaryLineNamesTheFailingCell) {
  Outcome o;
  o.status = Status::kError;
  o.cell = 1;
  o.cell_source = "d = {}";
  o.line = 2;
  o.ename = "KeyError";
  o.evalue = "'k'";
  o.duration_s = 1.45;
  o.output = "fails.out.ipynb";
  EXPECT_EQ(summary_line(job_at("fails.ipynb"), o),
            "error   fails.ipynb  cells[1] `d = {}`, line 2: KeyError: 'k'  1.45 s  -> "
            "fails.out.ipynb");
  o.status = Status::kTimeout;
  o.ename = "KeyboardInterrupt";
  o.evalue.clear();
  o.message = "the cell ran past --timeout 2 s and was interrupted";
  o.output.clear();
  o.duration_s = 3.57;
  EXPECT_EQ(summary_line(job_at("slow.ipynb"), o),
            "timeout slow.ipynb  cells[1] `d = {}`, line 2: the cell ran past --timeout 2 s and "
            "was interrupted  3.57 s");
}

TEST(Report, SummaryLineOfAnInvalidNotebookOrAKernelThatDidNotStart) {
  Outcome invalid;
  invalid.status = Status::kInvalid;
  invalid.message = "no 'cells' list";
  EXPECT_EQ(summary_line(job_at("bad.ipynb"), invalid), "invalid bad.ipynb  no 'cells' list");
  Outcome unstarted;
  unstarted.status = Status::kError;
  unstarted.code_cells = 3;
  unstarted.message = "cannot start a 'python3' kernel: too many";
  EXPECT_EQ(summary_line(job_at("x.ipynb"), unstarted),
            "error   x.ipynb  cannot start a 'python3' kernel: too many  0.00 s");
}

TEST(Report, ResultsCsvQuotesWhatNeedsIt) {
  json records = json::array({{{"path", "a,b.ipynb"},
                               {"status", "error"},
                               {"duration_s", 1.5},
                               {"kernel", "python3"},
                               {"cells", 3},
                               {"executed", 2},
                               {"cell", 1},
                               {"cell_source", "print(\"x\")"},
                               {"line", nullptr},
                               {"ename", "KeyError"},
                               {"evalue", "'k'\nmore"},
                               {"errors", 0},
                               {"artifacts", 0},
                               {"output", nullptr},
                               {"message", nullptr}}});
  EXPECT_EQ(results_csv(records),
            "path,status,duration_s,kernel,cells,executed,cell,cell_source,line,ename,evalue,"
            "errors,artifacts,output,message\n"
            "\"a,b.ipynb\",error,1.5,python3,3,2,1,\"print(\"\"x\"\")\",,KeyError,\"'k'\nmore\","
            "0,0,,\n");
}

}  // namespace
}  // namespace cellgate::notebooks
