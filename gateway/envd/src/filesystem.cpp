// envd's filesystem.Filesystem RPCs (Stat, ListDir, MakeDir, Move, Remove): each one a short
// Python program run in the sandbox kernel's jail as the kernel's uid (kernel::JailCommand), so
// a path means what it means to the sandbox's own processes and no path trick can reach past
// the jail (its mount namespace, Landlock and uid decide, not checks of ours). The answer is one
// JSON line on stdout, read with bounds on size and time.
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "call.hpp"
#include "cellgate/envd/connect.hpp"
#include "cellgate/envd/envd_api.hpp"
#include "cellgate/http/limits.hpp"
#include "cellgate/kernel/jail_command.hpp"

namespace cellgate::envd {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxAnswerBytes = 16 << 20;
constexpr auto kOperationTimeout = std::chrono::seconds(30);

// argv[1]: the operation, argv[2]: its arguments as JSON. Entries are envd's EntryInfo.
constexpr const char* kProgram = R"PY(
import datetime, errno, grp, json, os, pwd, shutil, stat, sys
MAX = 10000
class Exhausted(Exception):
    pass
def name_of(get, id):
    try:
        return get(id)[0]
    except Exception:
        return str(id)
def entry(path):
    st = os.lstat(path)
    m = st.st_mode
    kind = ('FILE_TYPE_DIRECTORY' if stat.S_ISDIR(m) else 'FILE_TYPE_FILE' if stat.S_ISREG(m)
            else 'FILE_TYPE_SYMLINK' if stat.S_ISLNK(m) else 'FILE_TYPE_UNSPECIFIED')
    e = {'name': os.path.basename(path.rstrip('/')) or '/', 'type': kind, 'path': path,
         'size': str(st.st_size), 'mode': stat.S_IMODE(m), 'permissions': stat.filemode(m),
         'owner': name_of(pwd.getpwuid, st.st_uid), 'group': name_of(grp.getgrgid, st.st_gid),
         'modifiedTime': datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc)
             .isoformat().replace('+00:00', 'Z')}
    if stat.S_ISLNK(m):
        e['symlinkTarget'] = os.path.realpath(path)
    meta = {}
    try:
        for key in os.listxattr(path, follow_symlinks=False):
            if key.startswith('user.e2b.'):
                meta[key[9:]] = os.getxattr(path, key, follow_symlinks=False).decode('utf-8', 'replace')
    except OSError:
        pass
    if meta:
        e['metadata'] = meta
    return e
def absolute(p):
    if not isinstance(p, str) or not p or '\0' in p:
        raise ValueError('a path is required')
    return os.path.normpath(os.path.join(os.getcwd(), os.path.expanduser(p)))
def run(op, a):
    if op == 'stat':
        return {'entry': entry(absolute(a.get('path')))}
    if op == 'list':
        root = absolute(a.get('path'))
        if not os.path.isdir(root):
            if not os.path.lexists(root):
                raise FileNotFoundError(root)
            raise ValueError('path is not a directory: ' + root)
        depth = max(1, min(int(a.get('depth') or 1), 32))
        out, todo = [], [(root, 1)]
        while todo and len(out) < MAX:
            d, level = todo.pop()
            with os.scandir(d) as it:
                for de in sorted(it, key=lambda x: x.name):
                    e = entry(de.path)
                    if e['type'] == 'FILE_TYPE_UNSPECIFIED':
                        continue
                    out.append(e)
                    if e['type'] == 'FILE_TYPE_DIRECTORY' and level < depth:
                        todo.append((de.path, level + 1))
                    if len(out) >= MAX:
                        break
        return {'entries': out}
    if op == 'mkdir':
        p = absolute(a.get('path'))
        if os.path.lexists(p):
            raise FileExistsError(p)
        os.makedirs(p)
        return {'entry': entry(p)}
    if op == 'move':
        src, dst = absolute(a.get('source')), absolute(a.get('destination'))
        os.rename(src, dst)
        return {'entry': entry(dst)}
    if op == 'remove':
        p = absolute(a.get('path'))
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)
        return {}
    if op == 'watch':
        return watch(a)
    raise ValueError('unknown operation')
# WatchDir: one JSON line per message ({"start": {}} once the watches are set, then
# {"filesystem": {name, type, entry?}}), inotify through ctypes. Types as E2B's envd (fsnotify)
# reports them. Ends when the watched directory goes; an error is the usual answer line.
IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 2, 4, 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_Q_OVERFLOW, IN_IGNORED, IN_ISDIR = 0x400, 0x800, 0x4000, 0x8000, 0x40000000
def event_type(m):
    if m & (IN_CREATE | IN_MOVED_TO):
        return 'EVENT_TYPE_CREATE'
    if m & IN_MODIFY:
        return 'EVENT_TYPE_WRITE'
    if m & (IN_DELETE | IN_DELETE_SELF):
        return 'EVENT_TYPE_REMOVE'
    if m & (IN_MOVED_FROM | IN_MOVE_SELF):
        return 'EVENT_TYPE_RENAME'
    if m & IN_ATTRIB:
        return 'EVENT_TYPE_CHMOD'
    return None
def watch(a):
    import ctypes, struct
    root = absolute(a.get('path'))
    if not os.path.isdir(root):
        if not os.path.lexists(root):
            raise FileNotFoundError(root)
        raise ValueError('path is not a directory: ' + root)
    recursive, with_entry = bool(a.get('recursive')), bool(a.get('includeEntry'))
    limit = max(1, int(a.get('maxWatches') or 1))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        e = ctypes.get_errno()
        if e in (errno.EMFILE, errno.ENFILE):
            raise Exhausted('inotify_init1: ' + os.strerror(e))
        raise OSError(e, 'inotify_init1: ' + os.strerror(e))
    mask = (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE |
            IN_DELETE_SELF | IN_MOVE_SELF | 0x1000000)  # IN_ONLYDIR
    dirs = {}
    out = sys.stdout
    def send(full, m):
        kind = event_type(m)
        if kind is None:
            return
        ev = {'name': os.path.relpath(full, root) if full != root else '', 'type': kind}
        if with_entry and m & (IN_CREATE | IN_MOVED_TO | IN_MODIFY | IN_ATTRIB):
            try:
                ev['entry'] = entry(full)
            except OSError:
                pass
        out.write(json.dumps({'filesystem': ev}) + '\n')
        out.flush()
    # A directory made under a recursive watch is watched only once its CREATE is read: what was
    # made in it before then (mkdir -p a/b; touch a/b/f) has no event of its own, so its tree is
    # scanned and reported as created. What the scan reports may also be queued by the new watch;
    # `scanned` drops that second copy, and is emptied once a read that began after the last scan
    # has drained the queue (all the copies came before it). At most 65,536 paths are remembered;
    # past that a copy may pass.
    scanned = set()
    reads, last_scan = 0, -1
    def add(top, report=False):
        nonlocal last_scan
        if report:
            last_scan = reads
        todo = [top]
        while todo:
            d = todo.pop()
            if len(dirs) >= limit:
                raise Exhausted('more than %d directories to watch' % limit)
            wd = libc.inotify_add_watch(fd, os.fsencode(d), mask)
            if wd < 0:
                e = ctypes.get_errno()
                if e == errno.ENOSPC:
                    raise Exhausted('inotify_add_watch: the watch limit is reached')
                if d == root:
                    raise OSError(e, 'inotify_add_watch: ' + os.strerror(e), d)
                continue  # gone already, or not ours to read
            dirs[wd] = d
            if recursive:
                try:
                    with os.scandir(d) as it:
                        for de in it:
                            is_dir = de.is_dir(follow_symlinks=False)
                            if is_dir:
                                todo.append(de.path)
                            if report:
                                if len(scanned) < 65536:
                                    scanned.add(de.path)
                                send(de.path, IN_CREATE | (IN_ISDIR if is_dir else 0))
                except OSError:
                    pass
    add(root)
    out.write(json.dumps({'start': {}}) + '\n')
    out.flush()
    size = 1 << 16
    while True:
        data = os.read(fd, size)
        reads += 1
        pos = 0
        while pos + 16 <= len(data):
            wd, m, _, n = struct.unpack_from('iIII', data, pos)
            name = data[pos + 16:pos + 16 + n].split(b'\0', 1)[0]
            pos += 16 + n
            if m & IN_Q_OVERFLOW:
                raise Exhausted('events came faster than they were read (the inotify queue overflowed)')
            d = dirs.get(wd)
            if d is None:
                continue
            if m & IN_IGNORED:
                del dirs[wd]
                if d == root:
                    return {}
                continue
            if not name:
                if d != root or not m & (IN_DELETE_SELF | IN_MOVE_SELF):
                    continue  # a subdirectory's own events come from its parent too
                full = root
            else:
                full = os.path.join(d, os.fsdecode(name))
            if m & (IN_CREATE | IN_MOVED_TO) and full in scanned:
                scanned.discard(full)  # reported by a scan (and watched by it, if a directory)
                continue
            send(full, m)
            if recursive and m & IN_ISDIR and m & (IN_CREATE | IN_MOVED_TO):
                add(full, report=bool(m & IN_CREATE))
        # A read that left room for another event (one is at most 16 + 256 bytes; 4096 to
        # spare) drained the queue.
        if len(data) < size - 4096 and last_scan < reads:
            scanned.clear()
try:
    answer = {'ok': run(sys.argv[1], json.loads(sys.argv[2]))}
except FileNotFoundError as e:
    answer = {'error': {'code': 'not_found', 'message': 'no such file or directory: %s' % (e.filename or e)}}
except Exhausted as e:
    answer = {'error': {'code': 'resource_exhausted', 'message': str(e)}}
except FileExistsError as e:
    answer = {'error': {'code': 'already_exists', 'message': 'already exists: %s' % (e.filename or e)}}
except (PermissionError, IsADirectoryError, NotADirectoryError, OSError, ValueError) as e:
    code = 'permission_denied' if isinstance(e, PermissionError) else 'invalid_argument'
    answer = {'error': {'code': code, 'message': str(e)}}
sys.stdout.write(json.dumps(answer))
)PY";

}  // namespace

const char* filesystem_program() {
  return kProgram;
}

Error filesystem_error(const nlohmann::json& error) {
  // What the program printed is the jail's: a field of another type is no error of ours.
  const auto text_of = [&](const char* key, const char* otherwise) {
    return error.is_object() && error.contains(key) && error[key].is_string()
               ? error[key].get<std::string>()
               : std::string(otherwise);
  };
  const std::string code = text_of("code", "internal");
  const std::string message = text_of("message", "the filesystem operation failed");
  ErrorCode ec = ErrorCode::kInternal;
  if (code == "not_found") {
    ec = ErrorCode::kNotFound;
  } else if (code == "already_exists") {
    return make_error(ErrorCode::kFailedPrecondition, "already_exists", message);
  } else if (code == "permission_denied") {
    ec = ErrorCode::kPermissionDenied;
  } else if (code == "invalid_argument") {
    ec = ErrorCode::kInvalidArgument;
  } else if (code == "resource_exhausted") {
    ec = ErrorCode::kResourceExhausted;
  }
  return make_error(ec, code, message);
}

namespace {

// Runs `op` in the jail and answers its {"ok": …} or the error it reported.
Result<json> run_operation(const kernel::JailTarget& target, const std::string& home,
                           const std::string& user, const std::string& op, const json& args) {
  kernel::CommandRequest request;
  request.argv = {"/usr/bin/python3", "-I", "-c", kProgram, op, args.dump()};
  request.cwd = home;
  request.env = {"HOME=" + home, "USER=" + user};
  CELLGATE_ASSIGN_OR_RETURN(auto cmd, kernel::JailCommand::start(target, request));
  cmd->close_stdin();
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + kOperationTimeout;
  while (!cmd->exited() || cmd->stdout_fd() >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return make_error(ErrorCode::kDeadlineExceeded, "fs_timeout",
                        "the filesystem operation took over 30 s");
    }
    pollfd fds[2] = {{cmd->stdout_fd(), POLLIN, 0},
                     {cmd->exited() ? -1 : cmd->control_fd(), POLLIN, 0}};
    if (::poll(fds, 2, static_cast<int>(left.count())) <= 0) {
      continue;
    }
    if (fds[0].fd >= 0 && fds[0].revents != 0) {
      char buf[16384];
      const ssize_t n = ::read(fds[0].fd, buf, sizeof buf);
      if (n <= 0) {
        cmd->close_output(fds[0].fd);
      } else if (out.size() + static_cast<std::size_t>(n) > kMaxAnswerBytes) {
        return make_error(ErrorCode::kResourceExhausted, "too_large",
                          "the answer exceeds 16 MiB (list fewer entries)");
      } else {
        out.append(buf, static_cast<std::size_t>(n));
      }
    }
    if (fds[1].fd >= 0 && fds[1].revents != 0) {
      cmd->read_control();
    }
  }
  const json answer = http::parse_json(out);
  if (!answer.is_object()) {
    return make_error(ErrorCode::kInternal, "fs_failed",
                      "the filesystem operation gave no answer (exit " +
                          std::to_string(cmd->exited()->exit_code) + ")");
  }
  if (answer.contains("ok")) {
    return answer["ok"];
  }
  return filesystem_error(answer.value("error", json::object()));
}

}  // namespace

void EnvdApi::filesystem(Call& call, const std::string& method) {
  static const std::map<std::string, std::string> kOps = {{"Stat", "stat"},
                                                          {"ListDir", "list"},
                                                          {"MakeDir", "mkdir"},
                                                          {"Move", "move"},
                                                          {"Remove", "remove"}};
  auto op = kOps.find(method);
  if (op == kOps.end()) {
    return call.exchange->reply(unary_error(
        call.req, make_error(ErrorCode::kNotFound, "no_route",
                             "filesystem.Filesystem/" + method.substr(0, 64) + " is not served")));
  }
  json args = json::object();
  for (const char* key : {"path", "source", "destination"}) {
    if (call.body.contains(key)) {
      if (!call.body[key].is_string() || call.body[key].get<std::string>().size() > 4096) {
        return call.exchange->reply(unary_error(
            call.req, make_error(ErrorCode::kInvalidArgument, "bad_request",
                                 std::string(key) + " must be a path of at most 4096 bytes")));
      }
      args[key] = call.body[key];
    }
  }
  if (call.body.contains("depth") && call.body["depth"].is_number_integer()) {
    args["depth"] = call.body["depth"];
  }
  options_.offload([this, op = op->second, args = std::move(args), req = std::move(call.req),
                    ex = call.exchange, kernel_id = call.sandbox.kernel_id] {
    auto target = options_.jail_of(kernel_id);
    auto answer = target ? run_operation(*target, options_.home, options_.user, op, args)
                         : Result<json>(target.error());
    ex->reply(answer ? unary_response(req, 200, answer->dump()) : unary_error(req, answer.error()));
  });
}

}  // namespace cellgate::envd
