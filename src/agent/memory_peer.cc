#include "agent/memory_peer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/tcp.h"
#include "proto/protocol.h"

namespace trainguard {

namespace {

using Msg = v1::MemoryCopyMessage;

constexpr std::uint32_t kMaxHeader = 1 << 20;
constexpr Nanos kServeDeadline = 10 * kSecond;  // no progress for this long ends a connection

bool SendMsg(int fd, const Msg& m) {
  std::string body = m.SerializeAsString();
  std::uint32_t len = htonl(static_cast<std::uint32_t>(body.size()));
  return SendAll(fd, reinterpret_cast<const char*>(&len), sizeof(len)) && SendAll(fd, body.data(), body.size());
}

bool RecvMsg(int fd, Msg* m) {
  std::uint32_t len = 0;
  if (!RecvAll(fd, reinterpret_cast<char*>(&len), sizeof(len))) return false;
  len = ntohl(len);
  if (len > kMaxHeader) return false;
  std::string body(len, '\0');
  return RecvAll(fd, body.data(), len) && m->ParseFromString(body);
}

// `size` bytes of the socket into the file, received straight into its
// pages (a mapping of it): no bounce through a buffer.
bool SocketToFile(int sock, int file, std::uint64_t size) {
  if (size == 0) return true;
  // Allocated first: a full tmpfs says ENOSPC here, where a store into a
  // mapped page it cannot back would raise SIGBUS.
  if (posix_fallocate(file, 0, static_cast<off_t>(size)) != 0) return false;
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, file, 0);
  if (data == MAP_FAILED) return false;
  bool ok = RecvAll(sock, static_cast<char*>(data), size);
  munmap(data, size);
  return ok;
}

// The whole file to the socket, after a header that names it. Sent from a
// mapping with send(MSG_NOSIGNAL): sendfile would raise SIGPIPE when the
// peer has closed (a refusal), which kills a process that does not ignore it.
bool SendFile(int sock, const std::string& path, Msg header) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  bool ok = fstat(fd, &st) == 0;
  const std::size_t size = ok ? static_cast<std::size_t>(st.st_size) : 0;
  void* data = ok && size > 0 ? mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
  close(fd);
  if (data == MAP_FAILED) return false;
  header.set_size(size);
  ok = ok && SendMsg(sock, header) && (size == 0 || SendAll(sock, static_cast<const char*>(data), size));
  if (data != nullptr) munmap(data, size);
  return ok;
}

Msg Done(const std::string& error) {
  Msg m;
  m.set_op(Msg::DONE);
  m.set_error(error);
  return m;
}

}  // namespace

MemoryPeerServer::MemoryPeerServer(MemoryStore* store, std::string node_id, std::string job_secret)
    : store_(store), node_id_(std::move(node_id)), job_secret_(std::move(job_secret)) {}

MemoryPeerServer::~MemoryPeerServer() { Stop(); }

Status MemoryPeerServer::Start(const std::string& address) {
  std::string error;
  listen_fd_ = Listen(address, &port_, &error);
  if (listen_fd_ < 0) return IoError("memory copy server on " + error);
  thread_ = std::thread([this] {
    while (!stopping_.load()) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 200) != 1) continue;
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) Serve(fd);
    }
  });
  return Status::Ok();
}

void MemoryPeerServer::Stop() {
  stopping_.store(true);
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

void MemoryPeerServer::Accept(int first, int count, int keep) {
  std::lock_guard<std::mutex> lock(accept_mu_);
  accept_first_ = first;
  accept_count_ = count;
  accept_keep_ = std::max(keep, 1);
}

void MemoryPeerServer::Serve(int fd) {
  SetDeadline(fd, kServeDeadline);
  Msg req;
  while (!stopping_.load() && RecvMsg(fd, &req)) {
    if (!job_secret_.empty() && req.job_secret() != job_secret_) {
      SendMsg(fd, Done("refused: not this job's secret"));
      break;
    }
    if (req.op() == Msg::PUT) {
      CopyPath path;
      if (!ParseCopyPath(req.path(), &path)) {
        SendMsg(fd, Done("not a copy's path: " + req.path().substr(0, 200)));
        break;
      }
      int keep = 0;
      {
        std::lock_guard<std::mutex> lock(accept_mu_);
        if (path.rank >= accept_first_ && path.rank < accept_first_ + accept_count_) keep = accept_keep_;
      }
      if (keep == 0) {
        SendMsg(fd, Done("rank " + std::to_string(path.rank) + " is not one this node keeps copies of"));
        break;
      }
      bool received = false;  // the bytes were taken off the socket
      Status s = store_->PutPeerCopy(path, req.size(), keep, [&](int file, std::uint64_t size) {
        return received = SocketToFile(fd, file, size);
      });
      if (!received) {  // the stream is out of step: say why and end it
        SendMsg(fd, Done(s.ok() ? "the copy broke off" : s.message()));
        break;
      }
      if (!SendMsg(fd, Done(s.ok() ? "" : s.message()))) break;
    } else if (req.op() == Msg::FETCH) {
      bool ok = true;
      for (int rank : req.ranks()) {
        for (const std::string& rel : store_->NewestPeerCopies(rank)) {
          Msg file;
          file.set_op(Msg::FILE);
          file.set_path(rel);
          file.set_origin(node_id_);
          ok = ok && SendFile(fd, store_->Root() + "/peer/" + rel, file);
        }
      }
      if (!ok || !SendMsg(fd, Done(""))) break;
    } else {
      SendMsg(fd, Done("unknown operation"));
      break;
    }
  }
  close(fd);
}

Status PushCopy(const std::string& peer, const MemoryStore& store, const std::string& relative, int keep,
                const std::string& job_secret, Nanos timeout) {
  std::string error;
  int fd = Connect(peer, timeout, &error);
  if (fd < 0) return IoError(error);
  Msg put;
  put.set_op(Msg::PUT);
  put.set_path(relative);
  put.set_keep(keep);
  put.set_job_secret(job_secret);
  Msg reply;
  bool sent = SendFile(fd, store.Root() + "/" + relative, put);
  bool answered = RecvMsg(fd, &reply);  // a refusal may cut the sending short: it says why
  close(fd);
  if (answered && reply.op() == Msg::DONE && !reply.error().empty()) return IoError(peer + ": " + reply.error());
  if (!sent || !answered || reply.op() != Msg::DONE) {
    return IoError(peer + ": the copy " + relative + " did not go through");
  }
  return Status::Ok();
}

StatusOr<FetchResult> FetchCopies(const std::string& peer, const std::vector<int>& ranks, MemoryStore* store,
                                  const std::string& job_secret, Nanos timeout) {
  std::string error;
  int fd = Connect(peer, timeout, &error);
  if (fd < 0) return IoError(error);
  Msg fetch;
  fetch.set_op(Msg::FETCH);
  for (int r : ranks) fetch.add_ranks(r);
  fetch.set_job_secret(job_secret);
  FetchResult result;
  Status status = SendMsg(fd, fetch) ? Status::Ok() : IoError(peer + ": the request did not go through");
  Msg m;
  while (status.ok()) {
    if (!RecvMsg(fd, &m)) {
      status = IoError(peer + ": the answer broke off after " + std::to_string(result.files) + " copies");
    } else if (m.op() == Msg::DONE) {
      if (!m.error().empty()) status = IoError(peer + ": " + m.error());
      break;
    } else if (CopyPath path; m.op() != Msg::FILE || !ParseCopyPath(m.path(), &path) ||
                              std::find(ranks.begin(), ranks.end(), path.rank) == ranks.end()) {
      status = IoError(peer + ": sent something other than a copy asked for");
    } else {
      bool received = false;
      status = store->PutFetchedCopy(path, m.size(), m.origin(), [&](int file, std::uint64_t size) {
        return received = SocketToFile(fd, file, size);
      });
      if (!received) status = IoError(peer + ": the copy " + m.path() + " broke off");
      if (status.ok()) {
        ++result.files;
        result.bytes += static_cast<std::int64_t>(m.size());
        result.origin = m.origin();
      }
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return result;
}

}  // namespace trainguard
