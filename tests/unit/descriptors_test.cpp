// The descriptor guard: counts, headroom, and a refusal with the reason when the process is
// near its RLIMIT_NOFILE (lowered here in a forked child, never in the test process itself).
#include "cellgate/util/descriptors.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

namespace cellgate {
namespace {

TEST(DescriptorsTest, CountsWhatIsOpen) {
  const std::size_t before = descriptors_open();
  ASSERT_GT(before, 2u);  // at least stdin, stdout, stderr
  std::vector<int> fds;
  for (int i = 0; i < 5; ++i) {
    fds.push_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  }
  EXPECT_EQ(descriptors_open(), before + 5);
  for (int fd : fds) {
    ::close(fd);
  }
  EXPECT_EQ(descriptors_open(), before);
}

TEST(DescriptorsTest, HeadroomIsASixteenthWithinBounds) {
  EXPECT_GE(descriptor_headroom(), 32u);
  EXPECT_LE(descriptor_headroom(), 256u);
  EXPECT_FALSE(near_descriptor_limit(3));
  EXPECT_TRUE(near_descriptor_limit(static_cast<int>(descriptor_limit() - 1)));
}

// In a child: the limit lowered to 40 above the highest descriptor; descriptors opened until 20
// numbers are free: a start that needs 32 is refused with the reason, one that needs 8 is not,
// and the last descriptor counts as near the limit (headroom is at least 32).
TEST(DescriptorsTest, RefusesNearTheLimit) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int highest = ::open("/dev/null", O_RDONLY);
    for (int fd = highest; fd < 4096; ++fd) {
      if (::fcntl(fd, F_GETFD) != -1) {
        highest = fd;
      }
    }
    const rlim_t n = static_cast<rlim_t>(highest) + 1 + 40;
    const rlimit lowered{n, n};
    if (::setrlimit(RLIMIT_NOFILE, &lowered) != 0) {
      _exit(10);
    }
    int last = -1;
    while (descriptors_free() > 20) {
      const std::size_t before = descriptors_free();
      last = ::open("/dev/null", O_RDONLY);
      if (last < 0 || descriptors_free() != before - 1) {
        _exit(14);
      }
    }
    if (!near_descriptor_limit(last)) {
      _exit(11);
    }
    auto refused = require_free_descriptors(32, "starting a kernel");
    if (refused || refused.error().code != ErrorCode::kResourceExhausted ||
        refused.error().message.find("starting a kernel needs 32") == std::string::npos) {
      _exit(12);
    }
    if (!require_free_descriptors(8, "a small thing")) {
      _exit(13);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10 setrlimit, 11 near, 12 refusal, 13 small need, 14 count";
}

}  // namespace
}  // namespace cellgate
