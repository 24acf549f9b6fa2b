#include "controller/leadership.h"

#include <unistd.h>

#include <cstdio>
#include <random>

namespace trainguard {

Leadership::Leadership(std::unique_ptr<EventStore> store, std::string job_id, std::string holder, Nanos ttl)
    : store_(std::move(store)), job_id_(std::move(job_id)), holder_(std::move(holder)), ttl_(ttl) {}

Leadership::~Leadership() {
  Stop();
  if (epoch_.load() > 0 && !lost_.load()) (void)store_->ReleaseLease(job_id_, holder_);
}

std::string Leadership::Holder() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::random_device rd;
  char tail[16];
  std::snprintf(tail, sizeof(tail), "%08x", rd());
  return std::string(host) + ":" + std::to_string(getpid()) + ":" + tail;
}

bool Leadership::WaitToLead(const std::function<bool()>& cancelled) {
  std::string said;
  for (;;) {
    auto lease = store_->AcquireLease(job_id_, holder_, ttl_);
    if (lease.ok() && lease->granted) {
      epoch_ = lease->epoch;
      if (!said.empty()) {
        std::fprintf(stderr, "trainguard: job %s: this controller (%s) leads it now (epoch %lld)\n",
                     job_id_.c_str(), holder_.c_str(), static_cast<long long>(lease->epoch));
      }
      return true;
    }
    const std::string now = lease.ok() ? "standby: job " + job_id_ + " is led by " + lease->holder + " (epoch " +
                                             std::to_string(lease->epoch) + "); taking it over if its lead expires"
                                       : "standby: the store is away (" + lease.status().message() +
                                             "); waiting for it to take the lead of job " + job_id_;
    if (now != said) {
      std::fprintf(stderr, "trainguard: %s\n", now.c_str());
      said = now;
    }
    const Nanos pause = ttl_ / 6;
    for (Nanos slept = 0; slept < pause; slept += 50 * kMillisecond) {
      if (cancelled && cancelled()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

void Leadership::KeepRenewing(EventStore* fenced, std::function<void(const std::string& why)> lost) {
  fenced_ = fenced;
  on_lost_ = std::move(lost);
  renewer_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::nanoseconds(ttl_ / 3), [this] { return stopping_; });
      if (stopping_) return;
      lock.unlock();
      Renew();
      lock.lock();
      if (lost_.load()) return;
    }
  });
}

void Leadership::Renew() {
  std::string why;
  if (const std::int64_t by = fenced_ != nullptr ? fenced_->FencedBy() : 0; by != 0) {
    why = "a write was fenced off: the lead of job " + job_id_ + " passed to epoch " + std::to_string(by);
  } else {
    auto lease = store_->AcquireLease(job_id_, holder_, ttl_);
    if (!lease.ok()) {
      ++renewal_errors_;  // the store is away: no loss; said by the store writer's own errors
      return;
    }
    if (lease->granted && lease->epoch == epoch_.load()) return;
    // Granted anew (its lead had expired, and another's after it): not the
    // lead this controller's state and fence belong to. Let it go at once.
    if (lease->granted) {
      (void)store_->ReleaseLease(job_id_, holder_);
      why = "the lead of job " + job_id_ + " lapsed and was held by another since (epoch " +
            std::to_string(lease->epoch) + "; this controller's was " + std::to_string(epoch_.load()) + ")";
    } else {
      why = "the lead of job " + job_id_ + " passed to " + lease->holder + " (epoch " +
            std::to_string(lease->epoch) + "; this controller's was " + std::to_string(epoch_.load()) + ")";
    }
  }
  if (lost_.exchange(true)) return;
  if (on_lost_) on_lost_(why);
}

void Leadership::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (renewer_.joinable() && renewer_.get_id() != std::this_thread::get_id()) renewer_.join();
}

}  // namespace trainguard
