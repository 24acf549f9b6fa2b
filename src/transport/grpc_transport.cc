#include "transport/grpc_transport.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <fstream>
#include <iterator>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "proto/trainguard.grpc.pb.h"
#include "transport/controller_inbox.h"

namespace trainguard {

namespace {

class SessionReactor;

// One agent's session as the controller holds it (its AgentLink). Shared by
// the controller and the session's reactor, which gRPC owns until OnDone:
// every use of the reactor is under `mu_` and stops once it is done.
// Sends are queued and written one at a time on gRPC's threads, so that the
// controller never blocks on the network.
class Session final : public AgentLink {
 public:
  // An agent that has read nothing of this many messages is cut off.
  static constexpr std::size_t kMaxQueuedSends = 1000;

  Session(SessionReactor* reactor, Clock* clock) : reactor_(reactor), clock_(clock) {}
  void Send(const v1::ControllerMessage& msg) override;
  void Close() override;
  Nanos LastHeardMono() const override { return last_heard_.load(std::memory_order_relaxed); }

  void Heard(Nanos mono) { last_heard_.store(mono, std::memory_order_relaxed); }
  // From the reactor's reactions.
  void WriteDone(bool ok);
  void ReadEnded();
  void ResumeReading();
  void Detach();

 private:
  // Ends the call once (mu_ held, no write in flight).
  void FinishLocked();
  // Writes the front of out_ (mu_ held). A clock probe is stamped now, when
  // it goes out, not when it was queued behind a fan-out.
  void WriteFrontLocked();
  // Drops what is queued but not being written (mu_ held): gRPC still reads
  // the front while a write is in flight.
  void DropUnsentLocked() { out_.erase(out_.begin() + (writing_ && !out_.empty() ? 1 : 0), out_.end()); }

  std::mutex mu_;
  SessionReactor* reactor_;  // null once done
  Clock* const clock_;
  std::deque<v1::ControllerMessage> out_;
  bool writing_ = false;
  bool closing_ = false;   // finish once what is queued is written
  bool finished_ = false;
  std::atomic<Nanos> last_heard_{0};
};

// Reads an agent's messages into the inbox, stamped on arrival, and writes
// what its Session queues. Runs on gRPC's callback threads, never waits
// for the controller.
class SessionReactor final : public grpc::ServerBidiReactor<v1::AgentMessage, v1::ControllerMessage> {
 public:
  SessionReactor(ControllerInbox* inbox, std::uint64_t conn, Clock* clock)
      : inbox_(inbox), conn_(conn), clock_(clock), session_(std::make_shared<Session>(this, clock)) {
    std::weak_ptr<Session> weak = session_;
    inbox_->Connect(conn_, session_, [weak] {
      if (auto s = weak.lock()) s->ResumeReading();
    });
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      session_->ReadEnded();
      return;
    }
    const Nanos arrived = clock_->MonotonicNanos();
    session_->Heard(arrived);
    v1::AgentMessage msg = std::move(in_);
    in_.Clear();
    // Paused (false): the dispatcher resumes the reads once it caught up.
    if (inbox_->Message(conn_, std::move(msg), arrived)) StartRead(&in_);
  }
  void OnWriteDone(bool ok) override { session_->WriteDone(ok); }
  // The agent went away or the server shuts down: a session whose reads the
  // inbox paused has no read to fail, so it ends here.
  void OnCancel() override { session_->ReadEnded(); }
  void OnDone() override {
    session_->Detach();
    inbox_->Disconnect(conn_);
    delete this;
  }
  void ReadAgain() { StartRead(&in_); }

 private:
  ControllerInbox* const inbox_;
  const std::uint64_t conn_;
  Clock* const clock_;
  std::shared_ptr<Session> session_;
  v1::AgentMessage in_;
};

void Session::Send(const v1::ControllerMessage& msg) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reactor_ == nullptr || closing_ || finished_) return;
  if (out_.size() >= kMaxQueuedSends) {  // the agent reads nothing: cut it off
    DropUnsentLocked();
    closing_ = true;
    if (!writing_) FinishLocked();
    return;
  }
  out_.push_back(msg);
  if (!writing_) {
    writing_ = true;
    WriteFrontLocked();
  }
}

void Session::WriteFrontLocked() {
  v1::ControllerMessage& next = out_.front();
  if (next.has_clock_probe()) next.mutable_clock_probe()->set_controller_unix_us(clock_->WallNanos() / 1000);
  reactor_->StartWrite(&next);
}

void Session::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closing_ = true;  // what is queued (a refusal, a Shutdown) goes first
  if (!writing_) FinishLocked();
}

void Session::WriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!out_.empty()) out_.pop_front();
  if (!ok) out_.clear();
  if (!out_.empty() && reactor_ != nullptr && !finished_) {
    WriteFrontLocked();
    return;
  }
  writing_ = false;
  if (closing_ || !ok) FinishLocked();
}

void Session::ReadEnded() {
  std::lock_guard<std::mutex> lock(mu_);
  closing_ = true;  // the agent went away (or half-closed): nothing more to say
  DropUnsentLocked();
  if (!writing_) FinishLocked();
}

void Session::ResumeReading() {
  std::lock_guard<std::mutex> lock(mu_);
  if (reactor_ != nullptr && !finished_) reactor_->ReadAgain();
}

void Session::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  reactor_ = nullptr;
  out_.clear();
}

void Session::FinishLocked() {
  if (finished_ || reactor_ == nullptr) return;
  finished_ = true;
  reactor_->Finish(grpc::Status::OK);
}

class Service final : public v1::Controller::CallbackService {
 public:
  Service(ControllerInbox* inbox, Clock* clock) : inbox_(inbox), clock_(clock) {}

  grpc::ServerBidiReactor<v1::AgentMessage, v1::ControllerMessage>* Session(
      grpc::CallbackServerContext*) override {
    return new SessionReactor(inbox_, next_conn_.fetch_add(1), clock_);
  }

 private:
  ControllerInbox* const inbox_;
  Clock* const clock_;
  std::atomic<std::uint64_t> next_conn_{1};
};

// Hands what the inbox delivers to the controller.
class ControllerSink final : public InboxSink {
 public:
  explicit ControllerSink(JobController* c) : c_(c) {}
  void OnConnect(std::uint64_t conn, std::shared_ptr<AgentLink> link) override { c_->OnConnect(conn, std::move(link)); }
  void OnMessage(std::uint64_t conn, const v1::AgentMessage& msg, Nanos arrived_mono) override {
    c_->OnMessage(conn, msg, arrived_mono);
  }
  void OnDisconnect(std::uint64_t conn) override { c_->OnDisconnect(conn); }

 private:
  JobController* const c_;
};

}  // namespace

class GrpcControllerServer::Impl {
 public:
  Impl(JobController* c, Clock* clock) : sink(c), inbox(&sink), service(&inbox, clock) {}
  ControllerSink sink;
  ControllerInbox inbox;
  Service service;
  std::thread dispatcher;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

GrpcControllerServer::GrpcControllerServer(JobController* controller, Clock* clock)
    : impl_(std::make_unique<Impl>(controller, clock)) {}
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
  if (impl_->server != nullptr && impl_->port != 0) {
    impl_->dispatcher = std::thread([this] { impl_->inbox.Run(); });
  }
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
  impl_->server->Wait();  // every session is done: its disconnect is queued
  impl_->server.reset();
  impl_->inbox.Stop();
  if (impl_->dispatcher.joinable()) impl_->dispatcher.join();
}

GrpcControllerServer::Stats GrpcControllerServer::stats() const { return impl_->inbox.stats(); }

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
  std::string address;                 // the one in use
  std::vector<std::string> addresses;  // every controller of the job
  std::size_t at = 0;                  // addresses[at] is `address`
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  grpc::ChannelArguments args;
  bool rotate = false;                 // Abandon: the next Reconnect starts with the next address

  // A channel (and stub) to addresses[i].
  void Use(std::size_t i) {
    at = i % addresses.size();
    address = addresses[at];
    channel = grpc::CreateCustomChannel(address, credentials, args);
    stub = v1::Controller::NewStub(channel);
  }

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
  grpc::ChannelArguments& args = impl_->args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // An agent may start before its controller: try again every second, not
  // with gRPC's default backoff of up to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  impl_->credentials = credentials;
  impl_->addresses.clear();
  for (std::size_t from = 0; from <= address.size();) {
    std::size_t comma = address.find(',', from);
    if (comma == std::string::npos) comma = address.size();
    if (comma > from) impl_->addresses.push_back(address.substr(from, comma - from));
    from = comma + 1;
  }
  if (impl_->addresses.empty()) return InvalidArgument("no controller address given");
  impl_->Use(0);
  auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms);
  // One address: wait for it. Several: a second each in turn (standbys do
  // not listen; the leader takes the session).
  bool connected = false;
  for (;;) {
    auto slice = impl_->addresses.size() == 1
                     ? deadline
                     : std::min(deadline, std::chrono::system_clock::now() + std::chrono::seconds(1));
    if (impl_->WaitConnected(slice, cancelled)) {
      connected = true;
      break;
    }
    if ((cancelled && cancelled()) || std::chrono::system_clock::now() >= deadline) break;
    impl_->Use(impl_->at + 1);
  }
  if (!connected) {
    if (cancelled && cancelled()) return Unavailable("stopped waiting for the controller at " + address + ": interrupted");
    return Unavailable("cannot reach the controller at " + address + " within " +
                       std::to_string(timeout_ms / 1000.0).substr(0, 4) + " s" +
                       (tls_ca.empty() ? " (if it serves TLS, give --tls-ca)"
                                       : " over TLS (does it serve TLS, with a certificate signed by " + tls_ca +
                                             " that names this host?)"));
  }
  if (!impl_->OpenSession()) return Unavailable("cannot open a session with " + impl_->address);
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
  const bool several = impl_->addresses.size() > 1;
  bool rotate = false;
  {
    std::lock_guard<std::mutex> lock(impl_->write_mu);
    std::swap(rotate, impl_->rotate);
  }
  if (several && rotate) impl_->Use(impl_->at + 1);
  auto deadline = std::chrono::system_clock::now() + std::chrono::nanoseconds(timeout);
  if (!impl_->WaitConnected(deadline, nullptr) || !impl_->OpenSession()) {
    if (several) impl_->Use(impl_->at + 1);  // the next one at the next try
    return false;
  }
  impl_->StartReader();
  return true;
}

void GrpcControllerLink::Abandon(const std::string& why) {
  (void)why;  // the reader reports the loss (the agent said why)
  std::lock_guard<std::mutex> lock(impl_->write_mu);
  impl_->rotate = true;
  impl_->broken = true;
  if (impl_->ctx != nullptr) impl_->ctx->TryCancel();
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
