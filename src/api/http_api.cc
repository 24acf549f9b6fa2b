#include "api/http_api.h"

#include <httplib.h>

#include <chrono>


namespace trainguard {


HttpApi::HttpApi(EventStore* store, HttpApiOptions options)
    : store_(store), options_(std::move(options)), server_(std::make_unique<httplib::Server>()) {}

HttpApi::~HttpApi() { Stop(); }

std::string HttpApi::url() const {
  std::string host = host_ == "0.0.0.0" || host_.empty() ? "127.0.0.1" : host_;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return "http://" + host + ":" + std::to_string(port_);
}

Status HttpApi::Start(JobController* controller) {
  TG_RETURN_IF_ERROR(Bind());
  Serve(controller);
  return Status::Ok();
}

void HttpApi::Serve(JobController* controller) {
  controller_ = controller;
  Route();
  thread_ = std::thread([this] {
    server_->listen_after_bind();
    serving_ended_ = true;
  });
}

Status HttpApi::Bind() {
  const std::string& listen = options_.listen;
  const std::size_t colon = listen.rfind(':');
  int port = -1;
  if (colon != std::string::npos) {
    try {
      std::size_t used = 0;
      port = std::stoi(listen.substr(colon + 1), &used);
      if (used != listen.size() - colon - 1) port = -1;
    } catch (const std::exception&) {
      port = -1;
    }
  }
  if (colon == std::string::npos || port < 0 || port > 65535) {
    return InvalidArgument("--http '" + listen + "' is not HOST:PORT (port 0 picks a free one)");
  }
  host_ = listen.substr(0, colon);
  if (host_.size() > 2 && host_.front() == '[' && host_.back() == ']') host_ = host_.substr(1, host_.size() - 2);
  if (host_.empty()) host_ = "0.0.0.0";
  // Every live stream holds a thread: the pool has room for them and more.
  const std::size_t threads = static_cast<std::size_t>(options_.max_streams) + 8;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_payload_max_length(1 << 20);
  // httplib sets SO_REUSEPORT, which lets a second controller bind the same
  // port and take half the requests: only SO_REUSEADDR here.
  server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  if (port == 0) {
    port_ = server_->bind_to_any_port(host_);
  } else {
    port_ = server_->bind_to_port(host_, port) ? port : -1;
  }
  if (port_ <= 0) {
    port_ = 0;
    return Unavailable("--http: cannot listen on " + listen + " (address in use or not this machine's?)");
  }
  return Status::Ok();
}

void HttpApi::Stop() {
  stopping_ = true;
  // Live streams see `stopping_`, send what is left and end; httplib's
  // stop() would cut them short (it stops calling their providers).
  for (int i = 0; i < 300 && streams_.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (thread_.joinable()) {
    // httplib's stop() does nothing until its loop runs: a Stop right after
    // Serve waits for the loop to start (or to have failed).
    while (!server_->is_running() && !serving_ended_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    server_->stop();
    thread_.join();
  }
}

}  // namespace trainguard
