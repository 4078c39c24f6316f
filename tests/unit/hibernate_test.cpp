// Hibernation's bookkeeping over the fake kernel (no CRIU, no root): ManagedKernel's hibernated
// state (the model, messages queued in order and sent on resume, one resume claimed per
// hibernation) and the registry's refusals (501-mapped where checkpoints cannot work, 409 for a
// busy kernel or one whose process cannot be checkpointed, which then runs on untouched).
// The real dump and restore: tests/conformance/test_hibernate.py.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <mutex>

#include "cellgate/kernels/registry.hpp"
#include "cellgate/testing/fake_kernel.hpp"
#include "cellgate/util/loop.hpp"

namespace cellgate::kernels {
namespace {

namespace fs = std::filesystem;
using kernel::Channel;
using nlohmann::json;
using testing::eventually;
using testing::FakeBackend;

class Inbox : public ChannelListener {
 public:
  void deliver(protocol::EnvelopePtr msg) override {
    std::lock_guard lock(mu_);
    types_.push_back(std::string(kernel::to_string(msg->channel())) + ":" + msg->header().msg_type);
  }
  void kernel_gone(const std::string&) override {}
  std::vector<std::string> types() const {
    std::lock_guard lock(mu_);
    return types_;
  }
  std::size_t count(const std::string& type) const {
    auto t = types();
    return static_cast<std::size_t>(std::count(t.begin(), t.end(), type));
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> types_;
};

protocol::EnvelopePtr request(const std::string& session, const std::string& type) {
  protocol::Session s("user", session);
  return protocol::Envelope::from_message(Channel::kShell, s.make(type, json::object()));
}

class HibernateTest : public ::testing::Test {
 protected:
  std::shared_ptr<ManagedKernel> make() {
    kernel::KernelSpec spec;
    spec.name = "python3";
    return std::make_shared<ManagedKernel>("k1", spec, "/nonexistent/k1", 2000000,
                                           std::map<std::string, std::string>{},
                                           [this] { return clock_.now(); });
  }
  // A process and connection whose unrouted messages (the replies to posts) reach `k`.
  ManagedKernel::Running running(const std::shared_ptr<ManagedKernel>& k = nullptr) {
    auto process = fake_.launch({});
    kernel::ClientOptions options;
    std::weak_ptr<ManagedKernel> weak = k;
    options.on_unrouted = [weak](const protocol::EnvelopePtr& msg) {
      if (auto self = weak.lock()) {
        self->on_unrouted(msg);
      }
    };
    auto conn = fake_.connect(*process.value(), options);
    return {std::move(process).value(), std::move(conn).value()};
  }
  util::ManualLoop clock_;
  FakeBackend fake_;
};

TEST_F(HibernateTest, HibernatedReadsIdleQueuesMessagesAndSendsThemOnResume) {
  auto k = make();
  ASSERT_TRUE(k->started(running()).ok());
  auto inbox = std::make_shared<Inbox>();
  ASSERT_TRUE(k->attach(inbox, "s"));

  auto taken = k->begin_hibernate();
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(k->state(), KernelState::kHibernated);
  EXPECT_FALSE(k->connection());
  const KernelModel model = k->model();
  EXPECT_EQ(model.execution_state, "idle");
  EXPECT_TRUE(model.hibernated);
  EXPECT_EQ(model.to_json().at("hibernated"), true);
  // Twice: refused.
  EXPECT_EQ(k->begin_hibernate().error().reason, "hibernated");

  // Posted while hibernated: queued, not lost, not an error.
  ASSERT_TRUE(k->post(Channel::kShell, request("s", "kernel_info_request"), inbox).ok());
  ASSERT_TRUE(k->post(Channel::kShell, request("s", "kernel_info_request"), inbox).ok());
  // One resume is claimed per hibernation, whoever asks first.
  EXPECT_TRUE(k->claim_resume());
  EXPECT_FALSE(k->claim_resume());

  k->hibernated(std::move(taken->process));
  taken->connection.reset();
  auto kept = k->take_hibernated();
  ASSERT_TRUE(kept);
  EXPECT_FALSE(k->take_hibernated());  // taken once
  ASSERT_TRUE(k->resumed(running(k)).ok());
  EXPECT_EQ(k->state(), KernelState::kIdle);
  EXPECT_FALSE(k->model().hibernated);
  EXPECT_FALSE(k->model().to_json().contains("hibernated"));
  // Both queued requests reached the resumed kernel, and their replies their sender.
  ASSERT_TRUE(eventually([&] { return inbox->count("shell:kernel_info_reply") == 2; }));
  EXPECT_FALSE(k->claim_resume());  // not hibernated
}

TEST_F(HibernateTest, OnlyAnIdleKernelHibernatesAndAFailedResumeIsDead) {
  auto k = make();
  EXPECT_EQ(k->begin_hibernate().error().reason, "kernel_busy");  // starting
  ASSERT_TRUE(k->started(running()).ok());
  ASSERT_TRUE(k->begin_hibernate().ok());
  k->resume_failed("the image is corrupt");
  EXPECT_EQ(k->state(), KernelState::kDead);
  EXPECT_EQ(k->model().reason, "the image is corrupt");
  // A client restart of a hibernated kernel starts it afresh.
  auto k2 = make();
  ASSERT_TRUE(k2->started(running()).ok());
  ASSERT_TRUE(k2->begin_hibernate().ok());
  ASSERT_TRUE(k2->begin_restart().ok());
  EXPECT_EQ(k2->state(), KernelState::kRestarting);
}

class HibernateRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = (fs::temp_directory_path() / "cellgate-hibernate-XXXXXX").string();
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    root_ = dir;
    options_.state_dir = root_ + "/state";
    options_.kernel_start_timeout = 2;
    options_.uids.lease_dir = root_ + "/uid-ranges";
    options_.uids.base = 3100000;
  }
  void TearDown() override {
    registry_.reset();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  KernelRegistry& registry() {
    if (!registry_) {
      registry_ = std::make_unique<KernelRegistry>(options_, fake_);
    }
    return *registry_;
  }
  std::string start() {
    auto model = registry().start("python3", json::object());
    EXPECT_TRUE(model.ok()) << model.error().describe();
    return model ? model->id : "";
  }

  std::string root_;
  RegistryOptions options_;
  FakeBackend fake_;
  std::unique_ptr<KernelRegistry> registry_;
};

TEST_F(HibernateRegistryTest, WhereCheckpointsCannotWorkTheReasonIsGiven) {
  options_.checkpoints_unavailable = "no CRIU >= 4.2 found";
  const std::string id = start();
  auto r = registry().hibernate(id);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().reason, "checkpoints_unavailable");  // 501 (router_test)
  EXPECT_NE(r.error().message.find("no CRIU >= 4.2 found"), std::string::npos);
  EXPECT_EQ(registry().hibernate("no-such-kernel").error().code, ErrorCode::kNotFound);
}

TEST_F(HibernateRegistryTest, AProcessThatCannotBeCheckpointedRunsOnUntouched) {
  options_.checkpoints_unavailable = "";
  const std::string id = start();
  auto r = registry().hibernate(id);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(r.error().reason, "not_hibernatable");  // the fake's process, as a zygote kernel's
  auto k = registry().find(id).value();
  EXPECT_EQ(k->state(), KernelState::kIdle);
  ASSERT_TRUE(k->connection());
  EXPECT_TRUE(k->connection()->wait_ready(std::chrono::seconds(2)).ok());
  EXPECT_TRUE(registry().resume(id).ok());  // not hibernated: nothing to do
}

}  // namespace
}  // namespace cellgate::kernels
