#include "agent/file_calls.h"

#include <sys/syscall.h>

#include <map>
#include <set>
#include <string_view>

namespace trainguard {
namespace {

struct Syscall {
  std::string_view name;
  long number;
};

// Every call of the architecture (generated: cmake/syscall_names.cmake).
constexpr Syscall kSyscalls[] = {
#define TG_SYSCALL(n) {#n, SYS_##n},
#include "syscall_names.inc"
#undef TG_SYSCALL
};

// Calls on a file descriptor, by the argument that holds it. A descriptor
// that is not a regular file or directory (a pipe, a socket, a device) is
// told apart where it is read (storage_io.cc), so calls that take any kind
// of descriptor (read, write) are here; ioctl is not (a driver's call).
const std::map<std::string_view, int>& OnDescriptor() {
  static const std::map<std::string_view, int> calls = {
      {"read", 0},           {"write", 0},          {"pread64", 0},        {"pwrite64", 0},
      {"readv", 0},          {"writev", 0},         {"preadv", 0},         {"pwritev", 0},
      {"preadv2", 0},        {"pwritev2", 0},       {"close", 0},          {"fstat", 0},
      {"lseek", 0},          {"fcntl", 0},          {"flock", 0},          {"fsync", 0},
      {"fdatasync", 0},      {"ftruncate", 0},      {"getdents", 0},       {"getdents64", 0},
      {"fchdir", 0},         {"fchmod", 0},         {"fchown", 0},         {"fstatfs", 0},
      {"readahead", 0},      {"fadvise64", 0},      {"fallocate", 0},      {"sync_file_range", 0},
      {"syncfs", 0},         {"fgetxattr", 0},      {"fsetxattr", 0},      {"flistxattr", 0},
      {"fremovexattr", 0},   {"copy_file_range", 0}, {"splice", 0},        {"tee", 0},
      {"open_by_handle_at", 0}, {"quotactl_fd", 0}, {"sendfile", 1},
      {"mmap", 4},
  };
  return calls;
}

// Calls on a file that name no descriptor: a path (in the process's
// memory), or the file system as a whole (sync; msync writes a mapping's
// file back). Counted as a wait on storage only in state D (storage_io.cc).
const std::set<std::string_view>& OnPath() {
  static const std::set<std::string_view> calls = {
      "open", "openat", "openat2", "creat", "stat", "lstat", "newfstatat", "statx", "access", "faccessat",
      "faccessat2", "truncate", "chdir", "chroot", "chmod", "fchmodat", "fchmodat2", "chown", "lchown", "fchownat",
      "link", "linkat", "symlink", "symlinkat", "readlink", "readlinkat", "unlink", "unlinkat", "rename",
      "renameat", "renameat2", "mkdir", "mkdirat", "rmdir", "mknod", "mknodat", "utime", "utimes", "futimesat",
      "utimensat", "statfs", "getxattr", "lgetxattr", "setxattr", "lsetxattr", "listxattr", "llistxattr",
      "removexattr", "lremovexattr", "execve", "execveat", "name_to_handle_at", "inotify_add_watch", "open_tree",
      "mount", "umount2", "pivot_root", "swapon", "swapoff", "acct", "uselib", "quotactl", "sync", "msync",
      "io_submit",  // asynchronous I/O: a buffered read is done in the call
  };
  return calls;
}

// Every other call of x86-64 and aarch64: not a wait on a file (memory,
// processes, signals, time, sockets, pipes, events, keys, modules, ids).
const std::set<std::string_view>& NotOnFiles() {
  static const std::set<std::string_view> calls = {
      "_sysctl", "accept", "accept4", "add_key", "adjtimex", "afs_syscall", "alarm", "arch_prctl", "bind", "bpf",
      "brk", "cachestat", "capget", "capset", "clock_adjtime", "clock_getres", "clock_gettime", "clock_nanosleep",
      "clock_settime", "clone", "clone3", "close_range", "connect", "create_module", "delete_module", "dup",
      "dup2", "dup3", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait",
      "epoll_pwait2", "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "exit", "exit_group",
      "fanotify_init", "fanotify_mark", "finit_module", "fork", "fsconfig", "fsmount", "fsopen", "fspick",
      "futex", "futex_waitv", "get_kernel_syms", "get_mempolicy", "get_robust_list", "get_thread_area",
      "getcpu", "getcwd", "getegid", "geteuid", "getgid", "getgroups", "getitimer", "getpeername", "getpgid",
      "getpgrp", "getpid", "getpmsg", "getppid", "getpriority", "getrandom", "getresgid", "getresuid",
      "getrlimit", "getrusage", "getsid", "getsockname", "getsockopt", "gettid", "gettimeofday", "getuid",
      "init_module", "inotify_init", "inotify_init1", "inotify_rm_watch", "io_cancel", "io_destroy",
      "io_getevents", "io_pgetevents", "io_setup", "io_uring_enter", "io_uring_register",
      "io_uring_setup",
      "ioctl",  // a driver's (a GPU's ioctl in state D is the GPU's, not storage)
      "ioperm", "iopl", "ioprio_get", "ioprio_set", "kcmp", "kexec_file_load", "kexec_load",
      "keyctl", "kill", "landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self",
      "listen", "lookup_dcookie", "madvise", "map_shadow_stack", "mbind", "membarrier", "memfd_create", "memfd_secret",
      "migrate_pages", "mincore", "mlock", "mlock2", "mlockall", "modify_ldt", "mount_setattr", "move_mount",
      "move_pages", "mprotect", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedsend",
      "mq_unlink", "mremap", "msgctl", "msgget", "msgrcv", "msgsnd", "munlock", "munlockall", "munmap",
      "nanosleep", "nfsservctl", "pause", "perf_event_open", "personality", "pidfd_getfd", "pidfd_open",
      "pidfd_send_signal", "pipe", "pipe2", "pkey_alloc", "pkey_free", "pkey_mprotect", "poll", "ppoll",
      "prctl", "prlimit64", "process_madvise", "process_mrelease", "process_vm_readv", "process_vm_writev",
      "pselect6", "ptrace", "putpmsg", "query_module", "reboot", "recvfrom", "recvmmsg", "recvmsg",
      "remap_file_pages", "request_key", "restart_syscall", "rseq", "rt_sigaction", "rt_sigpending",
      "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait",
      "rt_tgsigqueueinfo", "sched_get_priority_max", "sched_get_priority_min", "sched_getaffinity",
      "sched_getattr", "sched_getparam", "sched_getscheduler", "sched_rr_get_interval", "sched_setaffinity",
      "sched_setattr", "sched_setparam", "sched_setscheduler", "sched_yield", "seccomp", "security", "select",
      "semctl", "semget", "semop", "semtimedop", "sendmmsg", "sendmsg", "sendto", "set_mempolicy",
      "set_mempolicy_home_node", "set_robust_list", "set_thread_area", "set_tid_address", "setdomainname",
      "setfsgid", "setfsuid", "setgid", "setgroups", "sethostname", "setitimer", "setns", "setpgid",
      "setpriority", "setregid", "setresgid", "setresuid", "setreuid", "setrlimit", "setsid", "setsockopt",
      "settimeofday", "setuid", "shmat", "shmctl", "shmdt", "shmget", "shutdown", "sigaltstack", "signalfd",
      "signalfd4", "socket", "socketpair", "sysfs", "sysinfo", "syslog", "tgkill", "time", "timer_create",
      "timer_delete", "timer_getoverrun", "timer_gettime", "timer_settime", "timerfd_create", "timerfd_gettime",
      "timerfd_settime", "times", "tkill", "tuxcall", "umask", "uname", "unshare", "userfaultfd", "ustat",
      "vfork", "vhangup", "vmsplice", "vserver", "wait4", "waitid",
  };
  return calls;
}

}  // namespace

FileCall FileCallOf(long n) {
  static const std::map<long, FileCall> calls = [] {
    std::map<long, FileCall> out;
    for (const Syscall& s : kSyscalls) {
      if (auto it = OnDescriptor().find(s.name); it != OnDescriptor().end()) {
        out[s.number] = FileCall{std::string(s.name), it->second};
      } else if (OnPath().count(s.name)) {
        out[s.number] = FileCall{std::string(s.name), -1};
      }
    }
    return out;
  }();
  auto it = calls.find(n);
  return it == calls.end() ? FileCall{} : it->second;
}

std::vector<std::string> UnclassifiedSystemCalls() {
  std::vector<std::string> out;
  for (const Syscall& s : kSyscalls) {
    if (!OnDescriptor().count(s.name) && !OnPath().count(s.name) && !NotOnFiles().count(s.name)) {
      out.emplace_back(s.name);
    }
  }
  return out;
}

int SystemCallCount() { return static_cast<int>(std::size(kSyscalls)); }

std::string SystemCallName(long number) {
  for (const Syscall& s : kSyscalls) {
    if (s.number == number) return std::string(s.name);
  }
  return "";
}

}  // namespace trainguard
