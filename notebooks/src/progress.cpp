#include "progress.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include "cellgate/mutex.hpp"

namespace cellgate::notebooks {
namespace {

std::size_t terminal_columns() {
  winsize ws{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 10) {
    return ws.ws_col;
  }
  return 80;
}

}  // namespace

void Progress::begin(std::size_t job, std::string name, std::size_t cells) {
  MutexLock lock(mu_);
  active_[job] = Active{std::move(name), 0, cells};
  draw();
}

void Progress::cell(std::size_t job, std::size_t current) {
  MutexLock lock(mu_);
  if (auto it = active_.find(job); it != active_.end()) {
    it->second.current = current;
    draw();
  }
}

void Progress::end(std::size_t job) {
  MutexLock lock(mu_);
  active_.erase(job);
  ++done_;
  draw();
}

void Progress::print(const std::string& line, std::FILE* to) {
  MutexLock lock(mu_);
  clear();
  std::fputs((line + "\n").c_str(), to);
  std::fflush(to);
  draw();
}

void Progress::finish() {
  MutexLock lock(mu_);
  clear();
  enabled_ = false;
}

// "\r" + ESC [K: back to the start of the line and erase it (ECMA-48 EL).
void Progress::clear() {
  if (enabled_ && drawn_) {
    std::fputs("\r\x1b[K", stderr);
    std::fflush(stderr);
    drawn_ = false;
  }
}

void Progress::draw() {
  if (!enabled_ || active_.empty()) {
    clear();
    return;
  }
  std::string line;
  if (total_ > 1) {
    line = "[" + std::to_string(done_) + "/" + std::to_string(total_) + "] ";
  }
  if (active_.size() == 1) {
    const Active& a = active_.begin()->second;
    constexpr std::size_t kWidth = 20;
    const std::size_t filled = a.cells == 0 ? 0 : kWidth * a.current / a.cells;
    line += a.name + " [" + std::string(filled, '=') + std::string(kWidth - filled, ' ') +
            "] cell " + std::to_string(a.current) + "/" + std::to_string(a.cells);
  } else {
    bool first = true;
    for (const auto& [job, a] : active_) {
      line += (first ? "" : " | ") + a.name + " " + std::to_string(a.current) + "/" +
              std::to_string(a.cells);
      first = false;
    }
  }
  const std::size_t width = terminal_columns() - 1;
  if (line.size() > width) {
    line = line.substr(0, width - 3) + "...";
  }
  std::fputs(("\r" + line + "\x1b[K").c_str(), stderr);
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace cellgate::notebooks
