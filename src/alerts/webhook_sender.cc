#include "alerts/webhook_sender.h"

#include <httplib.h>

#include <chrono>
#include <cstdio>

namespace trainguard {

StatusOr<std::unique_ptr<WebhookSender>> WebhookSender::Create(const std::string& url, WebhookPolicy policy) {
  std::size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) return InvalidArgument("webhook URL '" + url + "' has no scheme (http:// or https://)");
  std::string scheme = url.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") {
    return InvalidArgument("webhook URL '" + url + "': scheme " + scheme + " is not http or https");
  }
  std::size_t path_at = url.find('/', scheme_end + 3);
  std::string origin = url.substr(0, path_at);
  std::string path = path_at == std::string::npos ? "/" : url.substr(path_at);
  if (origin.size() <= scheme_end + 3) return InvalidArgument("webhook URL '" + url + "' has no host");
  return std::unique_ptr<WebhookSender>(new WebhookSender(url, origin, path, policy));
}

WebhookSender::WebhookSender(std::string url, std::string origin, std::string path, WebhookPolicy policy)
    : url_(std::move(url)), origin_(std::move(origin)), path_(std::move(path)), policy_(policy) {
  thread_ = std::thread([this] { Run(); });
}

WebhookSender::~WebhookSender() {
  Flush(policy_.timeout);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void WebhookSender::Post(std::string json_body) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= policy_.max_queue) {
      queue_.pop_front();
      ++dropped_;
    }
    queue_.push_back(std::move(json_body));
  }
  cv_.notify_all();
}

bool WebhookSender::Flush(Nanos timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::nanoseconds(timeout), [&] { return queue_.empty() && !busy_; });
}

std::int64_t WebhookSender::delivered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return delivered_;
}
std::int64_t WebhookSender::given_up() const {
  std::lock_guard<std::mutex> lock(mu_);
  return given_up_;
}
std::int64_t WebhookSender::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

bool WebhookSender::Deliver(const std::string& body, std::string* why) {
  httplib::Client client(origin_);
  auto secs = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::nanoseconds(policy_.timeout));
  client.set_connection_timeout(secs);
  client.set_read_timeout(secs);
  client.set_write_timeout(secs);
  auto res = client.Post(path_, body, "application/json");
  if (!res) {
    *why = httplib::to_string(res.error());
    return false;
  }
  if (res->status < 200 || res->status >= 300) {
    *why = "HTTP " + std::to_string(res->status);
    return false;
  }
  return true;
}

void WebhookSender::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    std::string body = queue_.front();
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    std::string why;
    bool ok = false;
    Nanos backoff = policy_.first_backoff;
    for (int attempt = 1; attempt <= policy_.max_attempts && !ok; ++attempt) {
      ok = Deliver(body, &why);
      if (ok || attempt == policy_.max_attempts) break;
      std::unique_lock<std::mutex> wait(mu_);
      if (cv_.wait_for(wait, std::chrono::nanoseconds(backoff), [&] { return stopping_; })) break;
      backoff *= 2;
    }
    if (!ok) std::fprintf(stderr, "trainguard: alert to %s not delivered: %s\n", url_.c_str(), why.c_str());
    lock.lock();
    ++(ok ? delivered_ : given_up_);
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace trainguard
