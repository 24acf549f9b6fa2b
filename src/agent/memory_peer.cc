#include "agent/memory_peer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/sendfile.h>
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

// `size` bytes of the socket into the file.
bool SocketToFile(int sock, int file, std::uint64_t size) {
  std::vector<char> block(std::min<std::uint64_t>(size, 4 << 20));
  while (size > 0) {
    std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(size, block.size()));
    if (!RecvAll(sock, block.data(), n)) return false;
    for (std::size_t done = 0; done < n;) {
      ssize_t w = write(file, block.data() + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      done += static_cast<std::size_t>(w);
    }
    size -= n;
  }
  return true;
}

// The whole file to the socket, after a header that names it.
bool SendFile(int sock, const std::string& path, Msg header) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  bool ok = fstat(fd, &st) == 0;
  if (ok) {
    header.set_size(static_cast<std::uint64_t>(st.st_size));
    ok = SendMsg(sock, header);
  }
  off_t offset = 0;
  while (ok && offset < st.st_size) {
    ssize_t n = sendfile(sock, fd, &offset, static_cast<std::size_t>(st.st_size - offset));
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
  }
  close(fd);
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
      bool received = false;  // the bytes were taken off the socket
      Status s = store_->PutPeerCopy(path, req.size(), req.keep(), [&](int file, std::uint64_t size) {
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
