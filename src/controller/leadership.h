// Leadership: which of a job's controllers leads it (docs/standby.md).
// Every `trainguard controller` of one job on a PostgreSQL store competes
// for the job's lead in the store (EventStore::AcquireLease); one holds it,
// the others are standbys that take it over once its holder lets it
// expire. The holder renews it every ttl/3 on a thread of its own and on a
// connection of its own (a renewal must not queue behind the controller's
// writes). What is decided here is whether this process may act: it leads
// from the grant until its lead passed to another holder (a renewal refused,
// or a write fenced off: EventStore::FenceWrites), and then steps down. A
// renewal that fails because the store is away is no loss of the lead: the
// holder goes on (its writes wait in the store writer) and renews when the
// store is back; if a standby took the lead meanwhile, the holder learns it
// then and steps down, having written nothing (fenced) and commanded no
// agent that follows the new leader (every command carries the epoch).
//
// Thread safety: all methods may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/clock.h"
#include "store/event_store.h"

namespace trainguard {

class Leadership {
 public:
  // `store`: a connection of its own. `holder`: unique to this process
  // (Holder()). `ttl`: how long a lead lasts unrenewed.
  Leadership(std::unique_ptr<EventStore> store, std::string job_id, std::string holder, Nanos ttl);
  ~Leadership();  // stops renewing; lets the lead go if it still holds it

  // "HOST:PID:RANDOM".
  static std::string Holder();

  // Waits (standby) until this process leads the job: tries every ttl/6,
  // says once on stderr who leads meanwhile. False when `cancelled` says so.
  bool WaitToLead(const std::function<bool()>& cancelled);
  // Renews the lead until Stop; `lost` is called once (on the renewing
  // thread) when the lead passed to another holder, or when `fenced` (the
  // store the controller writes through, fenced to this lead) refused a
  // write for it.
  void KeepRenewing(EventStore* fenced, std::function<void(const std::string& why)> lost);
  void Stop();

  std::int64_t epoch() const { return epoch_.load(); }
  const std::string& holder() const { return holder_; }
  Nanos ttl() const { return ttl_; }
  bool lost() const { return lost_.load(); }
  // Renewals that failed because the store was away (counted, not a loss).
  std::int64_t renewal_errors() const { return renewal_errors_.load(); }

 private:
  void Renew();

  std::unique_ptr<EventStore> store_;
  const std::string job_id_;
  const std::string holder_;
  const Nanos ttl_;
  std::atomic<std::int64_t> epoch_{0};
  std::atomic<bool> lost_{false};
  std::atomic<std::int64_t> renewal_errors_{0};
  std::function<void(const std::string&)> on_lost_;
  EventStore* fenced_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread renewer_;
};

}  // namespace trainguard
