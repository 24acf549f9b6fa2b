#include "transport/grpc_transport.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <fstream>
#include <iterator>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "proto/trainguard.grpc.pb.h"

namespace trainguard {

namespace {

// Outgoing side of one server session: a queue drained by a writer thread, so
// that JobController never blocks on the network.
class SessionLink final : public AgentLink {
 public:
  SessionLink(grpc::ServerContext* ctx,
              grpc::ServerReaderWriter<v1::ControllerMessage, v1::AgentMessage>* stream)
      : ctx_(ctx), stream_(stream) {
    writer_ = std::thread([this] { WriteLoop(); });
  }
  ~SessionLink() override { StopWriter(); }

  void Send(const v1::ControllerMessage& msg) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    out_.push_back(msg);
    cv_.notify_all();
  }
  void Close() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closing_ = true;  // flush what is queued, then cancel
      cv_.notify_all();
    }
  }
  // Called by the session thread once reading ended.
  void StopWriter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      cv_.notify_all();
    }
    if (writer_.joinable()) writer_.join();
  }

 private:
  void WriteLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return closed_ || closing_ || !out_.empty(); });
      while (!out_.empty() && !closed_) {
        v1::ControllerMessage msg = std::move(out_.front());
        out_.pop_front();
        lock.unlock();
        bool ok = stream_->Write(msg);
        lock.lock();
        if (!ok) closed_ = true;
      }
      if (closing_ && !closed_) {
        closed_ = true;
        lock.unlock();
        ctx_->TryCancel();
        return;
      }
      if (closed_) return;
    }
  }

  grpc::ServerContext* ctx_;
  grpc::ServerReaderWriter<v1::ControllerMessage, v1::AgentMessage>* stream_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::ControllerMessage> out_;
  bool closing_ = false;
  bool closed_ = false;
  std::thread writer_;
};

class Service final : public v1::Controller::Service {
 public:
  explicit Service(JobController* controller) : controller_(controller) {}

  grpc::Status Session(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::ControllerMessage, v1::AgentMessage>* stream) override {
    std::uint64_t conn = next_conn_.fetch_add(1);
    auto link = std::make_shared<SessionLink>(ctx, stream);
    controller_->OnConnect(conn, link);
    v1::AgentMessage msg;
    while (stream->Read(&msg)) controller_->OnMessage(conn, msg);
    controller_->OnDisconnect(conn);
    link->StopWriter();
    return grpc::Status::OK;
  }

 private:
  JobController* controller_;
  std::atomic<std::uint64_t> next_conn_{1};
};

}  // namespace

class GrpcControllerServer::Impl {
 public:
  explicit Impl(JobController* c) : service(c) {}
  Service service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

GrpcControllerServer::GrpcControllerServer(JobController* controller)
    : impl_(std::make_unique<Impl>(controller)) {}

GrpcControllerServer::~GrpcControllerServer() { Shutdown(1000); }

namespace {

StatusOr<std::string> ReadPem(const char* what, const std::string& path) {
  std::ifstream in(path);
  if (!in) return InvalidArgument(std::string(what) + " " + path + " cannot be read");
  std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return InvalidArgument(std::string(what) + " " + path + " is not a PEM file");
  }
  return pem;
}

}  // namespace

Status GrpcControllerServer::Start(const std::string& address, const TlsServerFiles& tls) {
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!tls.cert.empty() || !tls.key.empty()) {
    if (tls.cert.empty() || tls.key.empty()) return InvalidArgument("TLS needs both --tls-cert and --tls-key");
    auto cert = ReadPem("--tls-cert", tls.cert);
    if (!cert.ok()) return cert.status();
    auto key = ReadPem("--tls-key", tls.key);
    if (!key.ok()) return key.status();
    grpc::SslServerCredentialsOptions options;
    options.pem_key_cert_pairs.push_back({*key, *cert});
    credentials = grpc::SslServerCredentials(options);
  }
  grpc::ServerBuilder builder;
  // One controller per port: without this, gRPC sets SO_REUSEPORT and a
  // second controller could share the port and take half of the agents.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(address, credentials, &impl_->port);
  builder.RegisterService(&impl_->service);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  impl_->server = builder.BuildAndStart();
  if (impl_->server == nullptr || impl_->port == 0) {
    impl_->server.reset();
    if (!tls.cert.empty()) {
      return InvalidArgument("cannot serve " + address + " with TLS: is --tls-key " + tls.key +
                             " the key of --tls-cert " + tls.cert + "? (or the address is in use)");
    }
    return Unavailable("cannot listen on " + address + " (address in use or not local?)");
  }
  return Status::Ok();
}

int GrpcControllerServer::port() const { return impl_->port; }

void GrpcControllerServer::Shutdown(int deadline_ms) {
  if (impl_->server == nullptr) return;
  impl_->server->Shutdown(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(deadline_ms));
  impl_->server->Wait();
  impl_->server.reset();
}

// ---------------------------------------------------------------------------

class GrpcControllerLink::Impl {
 public:
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Controller::Stub> stub;
  std::unique_ptr<grpc::ClientContext> ctx;  // one per session
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::ControllerMessage>> stream;
  std::mutex write_mu;  // guards stream (its writes and its replacement), ctx and broken
  bool broken = false;
  bool closed = false;
  std::thread reader;
  Agent* agent = nullptr;
  std::string address;

  // Waits for the channel, at most until `deadline`; false if not connected.
  bool WaitConnected(std::chrono::system_clock::time_point deadline, const std::function<bool()>& cancelled) {
    for (;;) {
      auto slice = std::min(deadline, std::chrono::system_clock::now() + std::chrono::milliseconds(200));
      if (channel->WaitForConnected(slice)) return true;
      if ((cancelled && cancelled()) || std::chrono::system_clock::now() >= deadline) return false;
    }
  }
  // Opens a session on the connected channel.
  bool OpenSession() {
    auto context = std::make_unique<grpc::ClientContext>();
    auto session = stub->Session(context.get());
    if (session == nullptr) return false;
    std::lock_guard<std::mutex> lock(write_mu);
    if (closed) return false;
    stream = std::move(session);  // the old stream goes before the context it used
    ctx = std::move(context);
    broken = false;
    return true;
  }
  void StartReader() {
    reader = std::thread([this] {
      v1::ControllerMessage msg;
      while (stream->Read(&msg)) agent->OnCommand(msg);
      grpc::Status st = stream->Finish();
      {
        std::lock_guard<std::mutex> lock(write_mu);
        broken = true;
      }
      agent->OnLinkLost(st.ok() ? "the controller ended the session"
                                : "the controller session failed: " + st.error_message());
    });
  }
};

GrpcControllerLink::GrpcControllerLink() : impl_(std::make_unique<Impl>()) {}

GrpcControllerLink::~GrpcControllerLink() { Close(); }

Status GrpcControllerLink::Connect(const std::string& address, int timeout_ms,
                                   const std::function<bool()>& cancelled, const std::string& tls_ca) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!tls_ca.empty()) {
    auto ca = ReadPem("--tls-ca", tls_ca);
    if (!ca.ok()) return ca.status();
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = *ca;
    credentials = grpc::SslCredentials(options);
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // An agent may start before its controller: try again every second, not
  // with gRPC's default backoff of up to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  impl_->channel = grpc::CreateCustomChannel(address, credentials, args);
  impl_->address = address;
  auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms);
  if (!impl_->WaitConnected(deadline, cancelled)) {
    if (cancelled && cancelled()) return Unavailable("stopped waiting for the controller at " + address + ": interrupted");
    return Unavailable("cannot reach the controller at " + address + " within " +
                       std::to_string(timeout_ms / 1000.0).substr(0, 4) + " s" +
                       (tls_ca.empty() ? " (if it serves TLS, give --tls-ca)"
                                       : " over TLS (does it serve TLS, with a certificate signed by " + tls_ca +
                                             " that names this host?)"));
  }
  impl_->stub = v1::Controller::NewStub(impl_->channel);
  if (!impl_->OpenSession()) return Unavailable("cannot open a session with " + address);
  return Status::Ok();
}

void GrpcControllerLink::Attach(Agent* agent) {
  impl_->agent = agent;
  impl_->StartReader();
}

bool GrpcControllerLink::Reconnect(Nanos timeout) {
  if (impl_->stub == nullptr || impl_->agent == nullptr) return false;
  // The old session's reader reported the loss and ends.
  if (impl_->reader.joinable()) impl_->reader.join();
  auto deadline = std::chrono::system_clock::now() + std::chrono::nanoseconds(timeout);
  if (!impl_->WaitConnected(deadline, nullptr) || !impl_->OpenSession()) return false;
  impl_->StartReader();
  return true;
}

bool GrpcControllerLink::Send(const v1::AgentMessage& msg) {
  std::lock_guard<std::mutex> lock(impl_->write_mu);
  if (impl_->broken || impl_->stream == nullptr) return false;
  if (!impl_->stream->Write(msg)) impl_->broken = true;
  return !impl_->broken;
}

void GrpcControllerLink::Close() {
  {
    std::lock_guard<std::mutex> lock(impl_->write_mu);
    impl_->closed = true;
    if (impl_->ctx != nullptr) impl_->ctx->TryCancel();
  }
  if (impl_->reader.joinable()) impl_->reader.join();
}

}  // namespace trainguard
