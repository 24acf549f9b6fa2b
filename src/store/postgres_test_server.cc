#include "store/postgres_test_server.h"

#include <fcntl.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#ifndef TG_PG_BINDIR
#define TG_PG_BINDIR "/usr/lib/postgresql/15/bin"
#endif

namespace trainguard {

namespace fs = std::filesystem;

namespace {

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// Forks `argv` with stdout and stderr to `log`, as the postgres user when
// we are root. Returns the child's pid, -1 on failure.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  uid_t uid = 0;
  gid_t gid = 0;
  if (geteuid() == 0) {
    const passwd* pw = getpwnam("postgres");
    if (pw == nullptr) return -1;
    uid = pw->pw_uid;
    gid = pw->pw_gid;
  }
  pid_t pid = fork();
  if (pid != 0) return pid;
  int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
  }
  if (uid != 0 && (setgid(gid) != 0 || setuid(uid) != 0)) _exit(126);
  prctl(PR_SET_PDEATHSIG, SIGQUIT);  // a test that dies takes its server along (immediate shutdown)
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > 2000 ? s.substr(s.size() - 2000) : s;
}

}  // namespace

PostgresTestServer::~PostgresTestServer() { Stop(); }

std::string PostgresTestServer::Url(const std::string& name) const {
  return "postgresql://trainguard@127.0.0.1:" + std::to_string(port_) + "/" + name;
}

Status PostgresTestServer::Start() {
  char tmpl[] = "/tmp/tgpg-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return IoError("cannot make a directory for the test server under /tmp");
  dir_ = tmpl;
  const std::string log = dir_ + "/server.log";
  if (geteuid() == 0) {
    const passwd* pw = getpwnam("postgres");
    if (pw == nullptr) return Unavailable("running as root and there is no postgres user to run the server as");
    if (chown(dir_.c_str(), pw->pw_uid, pw->pw_gid) != 0) return IoError("cannot chown " + dir_);
  }
  const std::string bin = TG_PG_BINDIR;
  pid_t init = Spawn({bin + "/initdb", "-D", dir_ + "/data", "-U", "trainguard", "-A", "trust", "-E", "UTF8",
                      "--locale=C.UTF-8", "--no-sync"},
                     log);
  int status = 0;
  if (init < 0 || waitpid(init, &status, 0) != init || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Unavailable("initdb (" + bin + "/initdb) failed:\n" + Tail(log));
  }
  port_ = FreePort();
  return Launch();
}

Status PostgresTestServer::Launch() {
  const std::string bin = TG_PG_BINDIR;
  const std::string log = dir_ + "/server.log";
  pid_ = Spawn({bin + "/postgres", "-D", dir_ + "/data", "-p", std::to_string(port_), "-k", dir_, "-c",
                "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=50"},
               log);
  if (pid_ < 0) return Unavailable("cannot start " + bin + "/postgres");
  const std::string url = Url("postgres");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int status = 0;
  while (PQping(url.c_str()) != PQPING_OK) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return Unavailable("the test server exited at start:\n" + Tail(log));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Unavailable("the test server took no connections within 30 s:\n" + Tail(log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status::Ok();
}

Status PostgresTestServer::Restart() {
  Shutdown();
  return Launch();
}

StatusOr<std::string> PostgresTestServer::CreateDatabase(const std::string& name) {
  PGconn* conn = PQconnectdb(Url("postgres").c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string msg = PQerrorMessage(conn);
    PQfinish(conn);
    return Unavailable("test server: " + msg);
  }
  PGresult* r = PQexec(conn, ("CREATE DATABASE \"" + name + "\"").c_str());
  const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
  std::string msg = PQerrorMessage(conn);
  PQclear(r);
  PQfinish(conn);
  if (!ok) return IoError("test server: create database " + name + ": " + msg);
  return Url(name);
}

void PostgresTestServer::Shutdown() {
  if (pid_ <= 0) return;
  kill(pid_, SIGINT);  // fast shutdown: ends sessions, then exits
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int status = 0;
  while (waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  pid_ = -1;
}

void PostgresTestServer::Stop() {
  Shutdown();
  if (!dir_.empty()) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    dir_.clear();
  }
}

}  // namespace trainguard
