// A real PostgreSQL server for tests: initdb into a fresh directory, the
// server listening on 127.0.0.1 at a free port (and a socket in that
// directory), stopped and removed again by the destructor. As root the
// server runs as the `postgres` user (PostgreSQL refuses root).
#pragma once

#include <sys/types.h>

#include <string>

#include "trainguard/status.h"

namespace trainguard {

class PostgresTestServer {
 public:
  PostgresTestServer() = default;
  ~PostgresTestServer();
  PostgresTestServer(const PostgresTestServer&) = delete;
  PostgresTestServer& operator=(const PostgresTestServer&) = delete;

  // Creates the cluster and starts the server; waits (bounded) until it
  // takes connections. Errors carry the server's log.
  Status Start();
  // Fast shutdown, then the directory goes. Safe to call twice.
  void Stop();
  // Fast shutdown and start again on the same data and port (clients see
  // their connections cut).
  Status Restart();
  // Makes an empty database; returns its URL.
  StatusOr<std::string> CreateDatabase(const std::string& name);
  // The URL of database `name` on this server.
  std::string Url(const std::string& name) const;
  int port() const { return port_; }
  pid_t pid() const { return pid_; }

 private:
  Status Launch();
  void Shutdown();

  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace trainguard
