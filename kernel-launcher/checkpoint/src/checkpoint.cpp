// Checkpoint and restore of a jail with CRIU: see checkpoint.hpp. The flags and their reasons
// come from a probe on this kind of host (jail/README.md, "Checkpoints").
#include "cellgate/checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "cellgate/checkpoint/criu.hpp"
#include "cellgate/checkpoint/rebase.hpp"
#include "cellgate/sys/dir_stream.hpp"
#include "cellgate/sys/file.hpp"
#include "cellgate/sys/text.hpp"
#include "skeleton.hpp"

namespace cellgate::checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The jail's mount points of the binds CRIU leaves outside the image (jail/spec.hpp's
// kJailConnDir and kJailWorkDir; not included, to keep this room off the jail's headers).
constexpr const char* kConnMount = "/run/kernel";
constexpr const char* kWorkMount = "/home/kernel";
constexpr const char* kMeta = "cellgate.json";
constexpr const char* kZstd = "/usr/bin/zstd";

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// The last error line of a CRIU log ("Error (criu/mount.c:…): …"), for the caller's message.
std::string criu_error(const std::string& log_file) {
  auto text = sys::read_file(log_file, std::size_t{8} << 20);
  if (!text) {
    return "(no log: " + text.error().message + ")";
  }
  std::string last;
  for (auto line : sys::split(*text, '\n')) {
    if (line.find("Error") != std::string_view::npos) {
      last = std::string(sys::trim(line));
    }
  }
  return last.empty() ? "(see " + log_file + ")" : last + " (see " + log_file + ")";
}

// The jail's processes: pid 1 and its descendants, by /proc/PID/task/TID/children.
std::vector<pid_t> process_tree(pid_t init) {
  std::vector<pid_t> pids = {init};
  for (std::size_t i = 0; i < pids.size() && pids.size() < 100000; ++i) {
    auto tasks = sys::DirStream::open("/proc/" + std::to_string(pids[i]) + "/task");
    if (!tasks) {
      continue;
    }
    while (auto t = tasks->next()) {
      const std::string children =
          sys::read_trimmed("/proc/" + std::to_string(pids[i]) + "/task/" + t->name + "/children");
      for (auto c : sys::split(children, ' ')) {
        if (!c.empty()) {
          pids.push_back(static_cast<pid_t>(std::stol(std::string(c))));
        }
      }
    }
  }
  return pids;
}

// One "key: value" field of /proc/PID/fdinfo/FD.
std::string fdinfo_field(const std::string& fdinfo, const std::string& key) {
  for (auto line : sys::split(fdinfo, '\n')) {
    if (line.substr(0, key.size() + 1) == key + ":") {
      return std::string(sys::trim(line.substr(key.size() + 1)));
    }
  }
  return "";
}

struct Externals {
  std::map<int, std::string> files;  // fd (0, 1, 2) → CRIU's key "file[mnt_id:inode]"
  std::string report_pipe;           // "pipe:[inode]" of pid 1's write end, or ""
};

// What the jail holds open from outside its mount namespace: the files the launcher gave it on
// 0, 1, 2, and pid 1's report pipe. Anything else leading out is refused, with what it is.
Result<Externals> find_externals(pid_t init) {
  std::set<std::string> jail_mounts;
  CELLGATE_ASSIGN_OR_RETURN(std::string mountinfo,
                            sys::read_file("/proc/" + std::to_string(init) + "/mountinfo"));
  for (auto line : sys::split(mountinfo, '\n')) {
    jail_mounts.insert(std::string(line.substr(0, line.find(' '))));
  }
  Externals ext;
  std::map<std::string, bool> pipe_read_end;   // pipe → some fd in the jail reads it
  std::map<std::string, bool> pipe_write_end;  // pipe → some fd in the jail writes it
  std::map<std::string, std::pair<pid_t, int>> pipe_writer;
  std::map<std::string, std::string> higher;  // key of an outside file on fd > 2 → what holds it
  for (pid_t pid : process_tree(init)) {
    const std::string proc = "/proc/" + std::to_string(pid);
    auto fds = sys::DirStream::open(proc + "/fd");
    if (!fds) {
      continue;  // ended meanwhile
    }
    while (auto e = fds->next()) {
      const int fd = std::atoi(e->name.c_str());
      auto link = sys::read_link(proc + "/fd/" + e->name);
      auto info = sys::read_file(proc + "/fdinfo/" + e->name);
      if (!link || !info) {
        continue;
      }
      const bool writes = (std::stoul(fdinfo_field(*info, "flags"), nullptr, 8) & O_ACCMODE) != 0;
      if (link->rfind("pipe:", 0) == 0) {
        pipe_read_end[*link] = pipe_read_end[*link] || !writes;
        pipe_write_end[*link] = pipe_write_end[*link] || writes;
        if (writes && pid == init) {
          pipe_writer[*link] = {pid, fd};
        }
        continue;
      }
      if (link->empty() || link->front() != '/' ||
          jail_mounts.count(fdinfo_field(*info, "mnt_id")) != 0) {
        continue;  // a socket, an anon inode, or a file of the jail's own mounts
      }
      struct stat st {};
      if (::stat((proc + "/fd/" + e->name).c_str(), &st) != 0) {
        continue;
      }
      std::ostringstream key;
      key << "file[" << std::hex << std::stoul(fdinfo_field(*info, "mnt_id")) << ":" << st.st_ino
          << "]";
      if (fd <= 2) {
        ext.files.emplace(fd, key.str());
      } else {
        // ipykernel keeps a dup of its original stdout and stderr: fine when it is one of them.
        higher.emplace(key.str(), "process " + std::to_string(pid) + " holds " + *link + " (fd " +
                                      e->name + ") from outside the jail");
      }
    }
  }
  for (const auto& [key, what] : higher) {
    bool on_stdio = false;
    for (const auto& [fd, stdio_key] : ext.files) {
      on_stdio = on_stdio || stdio_key == key;
    }
    if (!on_stdio) {
      return make_error(ErrorCode::kFailedPrecondition, "checkpoint_external_file", what);
    }
  }
  for (const auto& [pipe, read_inside] : pipe_read_end) {
    if (pipe_write_end[pipe] && read_inside) {
      continue;  // both ends in the jail
    }
    if (!pipe_write_end[pipe]) {
      // Fed from outside: a zygote jail's go pipe (init.hpp), which a restore cannot reconnect.
      return make_error(ErrorCode::kFailedPrecondition, "checkpoint_external_pipe",
                        "a pipe (" + pipe +
                            ") into the jail is fed from outside it; only jails "
                            "started in exec mode (no zygote) can be checkpointed");
    }
    if (pipe_writer.count(pipe) == 0 || !ext.report_pipe.empty()) {
      return make_error(ErrorCode::kFailedPrecondition, "checkpoint_external_pipe",
                        "a pipe (" + pipe + ") leads out of the jail other than pid 1's report");
    }
    ext.report_pipe = pipe;
  }
  return ext;
}

// The image's own files (criu/, the metadata; not the skeleton, whose modes are the jail's):
// mode 0600, as they hold the kernel's memory. Answers their total size.
std::uint64_t seal_files(const std::string& image_dir) {
  std::uint64_t bytes = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(image_dir + "/criu", ec);
       !ec && it != fs::end(it); it.increment(ec)) {
    if (it->is_regular_file(ec) && !it->is_symlink(ec)) {
      ::chmod(it->path().c_str(), 0600);
      bytes += it->file_size(ec);
    }
  }
  return bytes;
}

// The page images (pages-N.img), where the memory is: zstd -1 takes them to about a fifth.
Result<void> for_each_page_image(const std::string& dir, const std::string& suffix,
                                 const std::function<Result<void>(const std::string&)>& each) {
  CELLGATE_ASSIGN_OR_RETURN(sys::DirStream images, sys::DirStream::open(dir));
  while (auto e = images.next()) {
    if (e->name.rfind("pages-", 0) == 0 && e->name.size() > suffix.size() &&
        e->name.compare(e->name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      CELLGATE_TRY(each(dir + "/" + e->name));
    }
  }
  return {};
}

Result<void> run_zstd(const std::vector<std::string>& args) {
  std::string out;
  CELLGATE_ASSIGN_OR_RETURN(int status, run_program(kZstd, args, {}, &out));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return make_error(ErrorCode::kInternal, "checkpoint_zstd",
                      "zstd on " + args.back() + ": " + std::string(sys::trim(out)));
  }
  return {};
}

// cellgate.json as dump_jail() writes it: every field of its type, so that reading one cannot
// throw (the file comes from disk).
bool readable_meta(const json& meta) {
  if (!meta.is_object() || !meta.contains("version") || meta["version"] != 1) {
    return false;
  }
  for (const char* flag : {"conn", "work", "compressed", "work_saved"}) {
    if (meta.contains(flag) && !meta[flag].is_boolean()) {
      return false;
    }
  }
  for (const char* id : {"uid", "gid"}) {
    if (meta.contains(id) && !meta[id].is_number_unsigned()) {
      return false;
    }
  }
  for (const char* text : {"report_pipe", "cgroup"}) {
    if (meta.contains(text) && !meta[text].is_string()) {
      return false;
    }
  }
  if (meta.contains("files")) {
    if (!meta["files"].is_object()) {
      return false;
    }
    for (const auto& [fd, key] : meta["files"].items()) {
      if (!key.is_string()) {
        return false;
      }
    }
  }
  return true;
}

// `from`'s contents into the existing dir `to`, as they are: modes, owners, links not followed,
// one file system.
Result<void> copy_tree_into(const std::string& from, const std::string& to) {
  std::string out;
  CELLGATE_ASSIGN_OR_RETURN(
      int status,
      run_program("/bin/cp", {"-a", "--one-file-system", "--no-target-directory", from + "/.", to},
                  {}, &out));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return make_error(ErrorCode::kInternal, "checkpoint_work",
                      "copying the work dir " + from + ": " + std::string(sys::trim(out)));
  }
  return {};
}

Result<void> copy_tree(const std::string& from, const std::string& to) {
  if (::mkdir(to.c_str(), 0700) != 0) {
    return errno_error(ErrorCode::kInternal, "checkpoint_image", "mkdir('" + to + "')", errno);
  }
  return copy_tree_into(from, to);
}

// Gives `root` and whatever is under it owned by the source's uid or gid to the copy's; links
// are changed, not followed.
Result<void> reown_tree(const std::string& root, const Rebase& r) {
  auto reown = [&](const std::string& path) -> Result<void> {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
      return {};
    }
    const uid_t uid = st.st_uid == r.from_uid ? r.to_uid : st.st_uid;
    const gid_t gid = st.st_gid == r.from_gid ? r.to_gid : st.st_gid;
    if ((uid != st.st_uid || gid != st.st_gid) && ::lchown(path.c_str(), uid, gid) != 0) {
      return errno_error(ErrorCode::kInternal, "checkpoint_work", "lchown('" + path + "')", errno);
    }
    return {};
  };
  CELLGATE_TRY(reown(root));
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    CELLGATE_TRY(reown(it->path().string()));
  }
  if (ec) {
    return make_error(ErrorCode::kInternal, "checkpoint_work",
                      "walking " + root + ": " + ec.message());
  }
  return {};
}

}  // namespace

Result<DumpFigures> dump_jail(const DumpRequest& request) {
  if (::mkdir(request.image_dir.c_str(), 0700) != 0) {
    return errno_error(ErrorCode::kFailedPrecondition, "checkpoint_image",
                       "mkdir('" + request.image_dir + "')", errno);
  }
  const std::string images = request.image_dir + "/criu";
  const std::string skeleton = request.image_dir + "/root";
  for (const auto& dir : {images, skeleton}) {
    if (::mkdir(dir.c_str(), 0700) != 0) {
      return errno_error(ErrorCode::kInternal, "checkpoint_image", "mkdir('" + dir + "')", errno);
    }
  }
  CELLGATE_TRY(copy_skeleton("/proc/" + std::to_string(request.init_pid) + "/root", skeleton));
  const bool save_work =
      request.leave_running && !request.work_dir.empty() && request.work_dir.front() == '/';
  if (save_work) {
    // The work dir is a bind CRIU leaves outside the image; a copy started from a snapshot needs
    // its files as they are now (the kernel is idle: the caller refuses a busy one).
    CELLGATE_TRY(copy_tree(request.work_dir, request.image_dir + "/work"));
  }
  CELLGATE_ASSIGN_OR_RETURN(Externals ext, find_externals(request.init_pid));

  std::vector<std::string> args = {"dump", "-t", std::to_string(request.init_pid), "-D", images,
                                   "-o", "dump.log",
                                   // The jail has no network of its own to freeze.
                                   "--network-lock", "skip",
                                   // A debugger kernel's TCP connections on its own loopback
                                   // (debugpy's adapter and pydevd): both ends are in the
                                   // dumped tree and its network namespace. Other kernels have
                                   // no TCP socket at all (seccomp).
                                   "--tcp-established",
                                   // Binds of host paths (/usr, /etc files): found by path.
                                   "--external", "mnt[]"};
  json meta = {{"version", 1},
               {"conn", !request.conn_dir.empty()},
               {"work", !request.work_dir.empty()},
               {"files", json::object()},
               {"report_pipe", ext.report_pipe},
               {"compressed", false},
               {"uid", request.uid},
               {"gid", request.gid},
               {"cgroup", request.cgroup_name},
               {"work_saved", save_work}};
  if (request.leave_running) {
    args.emplace_back("--leave-running");
  }
  if (!request.conn_dir.empty()) {
    args.insert(args.end(), {"--external", std::string("mnt[") + kConnMount + "]:conn"});
  }
  if (!request.work_dir.empty()) {
    args.insert(args.end(), {"--external", std::string("mnt[") + kWorkMount + "]:work"});
  }
  for (const auto& [fd, key] : ext.files) {
    args.insert(args.end(), {"--external", key});
    meta["files"][std::to_string(fd)] = key;
  }
  CELLGATE_TRY(sys::atomic_write(request.image_dir + "/" + kMeta, meta.dump(1), 0600,
                                 sys::Durability::kFsync, "checkpoint_image"));

  DumpFigures figures;
  const auto start = std::chrono::steady_clock::now();
  // CRIU writes its log to criu/dump.log; its stdout and stderr stay ours.
  CELLGATE_ASSIGN_OR_RETURN(int status, run_program(request.criu, args));
  figures.dump_ms = ms_since(start);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return make_error(ErrorCode::kFailedPrecondition, "checkpoint_failed",
                      "criu dump of the jail (pid " + std::to_string(request.init_pid) +
                          ") failed, and it runs on: " + criu_error(images + "/dump.log"));
  }
  figures.raw_bytes = seal_files(request.image_dir);
  if (request.compress && ::access(kZstd, X_OK) == 0) {
    const auto zstd_start = std::chrono::steady_clock::now();
    CELLGATE_TRY(for_each_page_image(images, ".img", [](const std::string& image) {
      return run_zstd({"-1", "-q", "--rm", image});
    }));
    figures.compress_ms = ms_since(zstd_start);
    meta["compressed"] = true;
    CELLGATE_TRY(sys::atomic_write(request.image_dir + "/" + kMeta, meta.dump(1), 0600,
                                   sys::Durability::kFsync, "checkpoint_image"));
  }
  figures.image_bytes = seal_files(request.image_dir);
  return figures;
}

Result<Restored> restore_jail(const RestoreRequest& request) {
  CELLGATE_ASSIGN_OR_RETURN(std::string meta_text, sys::read_file(request.image_dir + "/" + kMeta,
                                                                  1 << 20, "checkpoint_image"));
  const json meta = json::parse(meta_text, nullptr, false);
  if (!readable_meta(meta)) {
    return make_error(ErrorCode::kFailedPrecondition, "checkpoint_image",
                      request.image_dir + " holds no checkpoint this version can read");
  }
  const std::string images = request.image_dir + "/criu";
  std::vector<std::string> args = {"restore", "-o", "restore.log", "-d",
                                   // The restored pid 1 becomes our child, to wait for.
                                   "--restore-sibling", "--network-lock", "skip",
                                   "--tcp-established", "--external", "mnt[]"};
  std::vector<int> keep;
  auto need = [&](const char* what, const std::string& value) -> Result<void> {
    if (value.empty()) {
      return make_error(ErrorCode::kInvalidArgument, "checkpoint_restore",
                        std::string("the checkpoint was made with a ") + what +
                            ", and none was given to restore it with");
    }
    return {};
  };
  if (meta.value("conn", false)) {
    CELLGATE_TRY(need("connection dir", request.conn_dir));
    args.insert(args.end(), {"--external", "mnt[conn]:" + request.conn_dir});
  }
  if (meta.value("work", false)) {
    CELLGATE_TRY(need("work dir", request.work_dir));
    args.insert(args.end(), {"--external", "mnt[work]:" + request.work_dir});
  }
  if (meta.contains("files")) {
    for (const auto& [fd, key] : meta["files"].items()) {
      args.insert(args.end(), {"--inherit-fd", "fd[" + fd + "]:" + key.get<std::string>()});
      keep.push_back(std::atoi(fd.c_str()));
    }
  }
  const std::string pipe = meta.value("report_pipe", "");
  if (!pipe.empty()) {
    CELLGATE_TRY(need("report pipe", request.report_fd >= 0 ? "fd" : ""));
    args.insert(args.end(),
                {"--inherit-fd", "fd[" + std::to_string(request.report_fd) + "]:" + pipe});
    keep.push_back(request.report_fd);
  }

  // The restore's own scratch dir in the image dir: the image's files linked in, the page images
  // unpacked, the rebased records written; CRIU's log and pidfile. Several restores of one image
  // (a fork of 16) run at once, each in its own; the image itself is never written.
  std::string scratch = request.image_dir + "/run.XXXXXX";
  if (::mkdtemp(scratch.data()) == nullptr) {
    return errno_error(ErrorCode::kInternal, "checkpoint_restore", "mkdtemp('" + scratch + "')",
                       errno);
  }
  struct Scratch {
    std::string path;
    ~Scratch() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } scratch_guard{scratch};
  Rebase rebase;
  rebase.from_uid = rebase.to_uid = meta.value("uid", 0u);
  rebase.from_gid = rebase.to_gid = meta.value("gid", 0u);
  rebase.from_cgroup = rebase.to_cgroup = meta.value("cgroup", std::string());
  if (request.uid != 0 && rebase.from_uid != 0) {
    rebase.to_uid = request.uid;
    rebase.to_gid = request.gid;
  }
  if (!request.cgroup_name.empty() && !rebase.from_cgroup.empty()) {
    rebase.to_cgroup = request.cgroup_name;
  }
  double unpack_ms = 0;
  {
    const auto unpack_start = std::chrono::steady_clock::now();
    CELLGATE_ASSIGN_OR_RETURN(sys::DirStream files, sys::DirStream::open(images));
    while (auto e = files.next()) {
      const std::string from = images + "/" + e->name;
      const std::string to = scratch + "/" + e->name;
      if (e->name == "." || e->name == ".." || e->name == "dump.log" || e->name == "restore.log") {
        continue;
      }
      const std::string zst = ".img.zst";
      if (e->name.size() > zst.size() &&
          e->name.compare(e->name.size() - zst.size(), zst.size(), zst) == 0) {
        CELLGATE_TRY(run_zstd({"-d", "-q", "-f", from, "-o", to.substr(0, to.size() - 4)}));
        continue;
      }
      CELLGATE_ASSIGN_OR_RETURN(bool rebased, rebase_image(e->name, from, to, rebase));
      if (!rebased && ::link(from.c_str(), to.c_str()) != 0) {
        return errno_error(ErrorCode::kInternal, "checkpoint_restore",
                           "link('" + from + "', '" + to + "')", errno);
      }
    }
    unpack_ms = ms_since(unpack_start);
  }
  if (meta.value("work_saved", false)) {
    CELLGATE_TRY(need("work dir", request.work_dir));
    CELLGATE_TRY(copy_tree_into(request.image_dir + "/work", request.work_dir));
    CELLGATE_TRY(reown_tree(request.work_dir, rebase));
  }

  // The root CRIU mounts everything onto: a fresh tmpfs with the skeleton, as build_root() made.
  if (::mkdir("/run/cellgate", 0700) != 0 && errno != EEXIST) {
    return errno_error(ErrorCode::kInternal, "checkpoint_restore", "mkdir('/run/cellgate')", errno);
  }
  std::string root = "/run/cellgate/restore.XXXXXX";
  if (::mkdtemp(root.data()) == nullptr) {
    return errno_error(ErrorCode::kInternal, "checkpoint_restore", "mkdtemp('" + root + "')",
                       errno);
  }
  struct Root {
    std::string path;
    bool mounted = false;
    ~Root() {
      if (mounted) {
        ::umount2(path.c_str(), MNT_DETACH);  // the jail holds its own copy of the mount
      }
      ::rmdir(path.c_str());
    }
  } root_guard{root};
  if (::mount("cellgate-root", root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m") !=
      0) {
    return errno_error(ErrorCode::kInternal, "checkpoint_restore", "mount('tmpfs', '" + root + "')",
                       errno);
  }
  root_guard.mounted = true;
  // Private before the jail's mount namespace copies it: our unmount below must not propagate
  // into the jail's root.
  if (::mount(nullptr, root.c_str(), nullptr, MS_PRIVATE, nullptr) != 0) {
    return errno_error(ErrorCode::kInternal, "checkpoint_restore",
                       "mount('" + root + "', MS_PRIVATE)", errno);
  }
  CELLGATE_TRY(copy_skeleton(request.image_dir + "/root", root));
  // Its mount points for the work dir belong to the kernel's uid.
  CELLGATE_TRY(reown_tree(root, rebase));
  args.insert(args.end(), {"--root", root, "-D", scratch});
  const std::string pidfile = scratch + "/restore.pid";
  args.insert(args.end(), {"--pidfile", pidfile});

  Restored restored;
  restored.unpack_ms = unpack_ms;
  const auto start = std::chrono::steady_clock::now();
  // Not captured: CRIU's 1 and 2 may be what the jail inherits (--inherit-fd fd[1]:…).
  CELLGATE_ASSIGN_OR_RETURN(int status, run_program(request.criu, args, keep));
  restored.restore_ms = ms_since(start);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return make_error(ErrorCode::kFailedPrecondition, "restore_failed",
                      "criu restore of " + request.image_dir +
                          " failed: " + criu_error(scratch + "/restore.log"));
  }
  const std::string pid_text = sys::read_trimmed(pidfile);
  ::unlink(pidfile.c_str());
  restored.init_pid = static_cast<pid_t>(std::atol(pid_text.c_str()));
  if (restored.init_pid <= 0) {
    return make_error(ErrorCode::kInternal, "restore_failed",
                      "criu restore wrote no pid to " + pidfile);
  }
  return restored;
}

}  // namespace cellgate::checkpoint
