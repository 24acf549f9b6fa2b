// WebhookSender: POSTs JSON alerts to one URL (Slack-style incoming
// webhooks, paging systems) from a thread of its own, so that the
// controller never waits on a receiver.
//
// Post() only queues. The sender thread delivers in order; a delivery that
// fails (connection error, timeout, a status other than 2xx) is retried
// with exponential backoff up to max_attempts, then given up (counted). A
// full queue drops its oldest alert (counted). Thread safety: all methods
// may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/clock.h"
#include "trainguard/status.h"

namespace trainguard {

struct WebhookPolicy {
  int max_attempts = 4;                      // the first try and 3 retries
  Nanos first_backoff = 1 * kSecond;         // then 2 s, 4 s
  Nanos timeout = 5 * kSecond;               // connect + read, per attempt
  std::size_t max_queue = 1000;
};

class WebhookSender {
 public:
  // `url`: http://HOST[:PORT][/PATH] or https://... InvalidArgument names
  // what is wrong with it.
  static StatusOr<std::unique_ptr<WebhookSender>> Create(const std::string& url, WebhookPolicy policy = {});
  ~WebhookSender();  // delivers what is queued for up to `timeout`, then stops

  void Post(std::string json_body);
  // Waits until the queue is empty (delivered or given up) or `timeout` passed.
  bool Flush(Nanos timeout);

  std::int64_t delivered() const;
  std::int64_t given_up() const;
  std::int64_t dropped() const;
  const std::string& url() const { return url_; }

 private:
  WebhookSender(std::string url, std::string origin, std::string path, WebhookPolicy policy);
  void Run();
  bool Deliver(const std::string& body, std::string* why);

  const std::string url_;
  const std::string origin_;  // scheme://host:port
  const std::string path_;
  const WebhookPolicy policy_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  bool busy_ = false;  // a delivery is under way
  bool stopping_ = false;
  std::int64_t delivered_ = 0, given_up_ = 0, dropped_ = 0;
  std::thread thread_;
};

}  // namespace trainguard
