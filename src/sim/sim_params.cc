#include "sim/sim_params.h"

#include <cmath>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

namespace trainguard {

using nlohmann::json;

Status SimParams::MergeJson(const std::string& text, const std::string& origin) {
  json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded()) return InvalidArgument(origin + ": not valid JSON");
  if (!doc.is_object()) return InvalidArgument(origin + ": expected a JSON object of parameters");
  auto number = [&](const std::string& key, const json& v, double* out) -> Status {
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      return InvalidArgument(origin + ": " + key + ": expected a number, got " + v.dump());
    }
    *out = v.get<double>();
    return Status::Ok();
  };
  auto whole = [&](const std::string& key, const json& v, double* out) -> Status {
    TG_RETURN_IF_ERROR(number(key, v, out));
    if (*out != std::floor(*out)) return InvalidArgument(origin + ": " + key + ": expected a whole number, got " + v.dump());
    return Status::Ok();
  };
  std::map<std::string, std::function<Status(const json&)>> fields = {
      {"gpus", [&](const json& v) { double d; TG_RETURN_IF_ERROR(whole("gpus", v, &d)); gpus = static_cast<int>(d); return Status::Ok(); }},
      {"gpus_per_node", [&](const json& v) { double d; TG_RETURN_IF_ERROR(whole("gpus_per_node", v, &d)); gpus_per_node = static_cast<int>(d); return Status::Ok(); }},
      {"days", [&](const json& v) { return number("days", v, &days); }},
      {"seed", [&](const json& v) { double d; TG_RETURN_IF_ERROR(whole("seed", v, &d)); seed = static_cast<std::uint64_t>(d); return Status::Ok(); }},
      {"step_s", [&](const json& v) { return number("step_s", v, &step_s); }},
      {"checkpoint_interval_s", [&](const json& v) { return number("checkpoint_interval_s", v, &checkpoint_interval_s); }},
      {"checkpoint_blocked_s", [&](const json& v) { return number("checkpoint_blocked_s", v, &checkpoint_blocked_s); }},
      {"checkpoint_policy", [&](const json& v) {
         if (!v.is_string()) return InvalidArgument(origin + ": checkpoint_policy: expected \"fixed\" or \"auto\", got " + v.dump());
         checkpoint_policy = v.get<std::string>();
         return Status::Ok();
       }},
      {"memory_interval_s", [&](const json& v) { return number("memory_interval_s", v, &memory_interval_s); }},
      {"persist_s", [&](const json& v) { return number("persist_s", v, &persist_s); }},
      {"peer_copy_s", [&](const json& v) { return number("peer_copy_s", v, &peer_copy_s); }},
      {"peer_loss_fraction", [&](const json& v) { return number("peer_loss_fraction", v, &peer_loss_fraction); }},
      {"restore_memory_s", [&](const json& v) { return number("restore_memory_s", v, &restore_memory_s); }},
      {"restore_storage_s", [&](const json& v) { return number("restore_storage_s", v, &restore_storage_s); }},
      {"shutdown_s", [&](const json& v) { return number("shutdown_s", v, &shutdown_s); }},
      {"restart_s", [&](const json& v) { return number("restart_s", v, &restart_s); }},
      {"import_s_per_node", [&](const json& v) { return number("import_s_per_node", v, &import_s_per_node); }},
      {"store_s_per_rank", [&](const json& v) { return number("store_s_per_rank", v, &store_s_per_rank); }},
      {"nccl_init_s_per_rank", [&](const json& v) { return number("nccl_init_s_per_rank", v, &nccl_init_s_per_rank); }},
      {"fingerprint_every", [&](const json& v) { double d; TG_RETURN_IF_ERROR(whole("fingerprint_every", v, &d)); fingerprint_every = static_cast<int>(d); return Status::Ok(); }},
      {"model_parallel", [&](const json& v) { double d; TG_RETURN_IF_ERROR(whole("model_parallel", v, &d)); model_parallel = static_cast<int>(d); return Status::Ok(); }},
      {"diagnose_s", [&](const json& v) { return number("diagnose_s", v, &diagnose_s); }},
      {"diagnose", [&](const json& v) {
         if (!v.is_string()) return InvalidArgument(origin + ": diagnose: expected \"off\", \"quick\" or \"full\", got " + v.dump());
         diagnose = v.get<std::string>();
         return Status::Ok();
       }},
      {"spares", [&](const json& v) { double d; TG_RETURN_IF_ERROR(whole("spares", v, &d)); spares = static_cast<int>(d); return Status::Ok(); }},
      {"replacement_s", [&](const json& v) { return number("replacement_s", v, &replacement_s); }},
      {"pool", [&](const json& v) { double d; TG_RETURN_IF_ERROR(whole("pool", v, &d)); pool = static_cast<int>(d); return Status::Ok(); }},
      {"hang_timeout_s", [&](const json& v) { return number("hang_timeout_s", v, &hang_timeout_s); }},
      {"straggler_action", [&](const json& v) {
         if (!v.is_string()) return InvalidArgument(origin + ": straggler_action: expected \"report\" or \"evict\", got " + v.dump());
         straggler_action = v.get<std::string>();
         return Status::Ok();
       }},
      {"heartbeat_interval_s", [&](const json& v) { return number("heartbeat_interval_s", v, &heartbeat_interval_s); }},
      {"missed_heartbeats", [&](const json& v) { double d; TG_RETURN_IF_ERROR(whole("missed_heartbeats", v, &d)); missed_heartbeats = static_cast<int>(d); return Status::Ok(); }},
      {"rendezvous_timeout_s", [&](const json& v) { return number("rendezvous_timeout_s", v, &rendezvous_timeout_s); }},
      {"max_restarts", [&](const json& v) { double d; TG_RETURN_IF_ERROR(whole("max_restarts", v, &d)); max_restarts = static_cast<int>(d); return Status::Ok(); }},
      {"no_progress_restarts", [&](const json& v) { double d; TG_RETURN_IF_ERROR(whole("no_progress_restarts", v, &d)); no_progress_restarts = static_cast<int>(d); return Status::Ok(); }},
  };
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() == "notes") continue;
    auto f = fields.find(it.key());
    if (f == fields.end()) return InvalidArgument(origin + ": " + it.key() + ": unknown parameter");
    TG_RETURN_IF_ERROR(f->second(it.value()));
  }
  return Status::Ok();
}

Status SimParams::Validate() const {
  auto bad = [](const std::string& name, const std::string& what) { return InvalidArgument(name + ": " + what); };
  if (gpus < 1 || gpus > 10'000'000) return bad("gpus", "must be 1 to 10,000,000");
  if (gpus_per_node < 1 || gpus_per_node > 1024) return bad("gpus_per_node", "must be 1 to 1024");
  if (gpus % gpus_per_node != 0) {
    return bad("gpus", std::to_string(gpus) + " is not a whole number of nodes of " + std::to_string(gpus_per_node) + " GPUs");
  }
  if (!(days > 0) || days > 3650) return bad("days", "must be above 0 and at most 3650");
  if (!(step_s > 0)) return bad("step_s", "must be above 0");
  if (!(checkpoint_interval_s >= step_s)) return bad("checkpoint_interval_s", "must be at least one step (step_s)");
  if (checkpoint_blocked_s < 0) return bad("checkpoint_blocked_s", "must be 0 or more");
  if (checkpoint_policy != "fixed" && checkpoint_policy != "auto") return bad("checkpoint_policy", "must be fixed or auto");
  if (memory_interval_s != 0 && !(memory_interval_s >= step_s)) {
    return bad("memory_interval_s", "must be 0 (every save to storage) or at least one step (step_s)");
  }
  for (auto [name, v] : {std::pair{"persist_s", persist_s}, {"peer_copy_s", peer_copy_s},
                         {"restore_memory_s", restore_memory_s}, {"restore_storage_s", restore_storage_s}}) {
    if (!(v >= 0)) return bad(name, "must be 0 or more");
  }
  if (!(peer_loss_fraction >= 0 && peer_loss_fraction <= 1)) return bad("peer_loss_fraction", "must be 0 to 1");
  if (shutdown_s < 0) return bad("shutdown_s", "must be 0 or more");
  if (restart_s < 0) return bad("restart_s", "must be 0 or more");
  for (auto [name, v] : {std::pair{"import_s_per_node", import_s_per_node}, {"store_s_per_rank", store_s_per_rank},
                         {"nccl_init_s_per_rank", nccl_init_s_per_rank}}) {
    if (!(v >= 0)) return bad(name, "must be 0 or more");
  }
  if (fingerprint_every < 0) return bad("fingerprint_every", "must be 0 (off) or more");
  if (model_parallel < 0 || model_parallel > gpus || gpus % ModelParallel() != 0) {
    return bad("model_parallel", std::to_string(ModelParallel()) + " does not divide the " + std::to_string(gpus) +
                                     " GPUs into whole copies of the model (0: one node's GPUs)");
  }
  if (diagnose_s < 0) return bad("diagnose_s", "must be 0 or more");
  if (diagnose != "off" && diagnose != "quick" && diagnose != "full") return bad("diagnose", "must be off, quick or full");
  if (spares < 0) return bad("spares", "must be 0 or more");
  if (pool < -1) return bad("pool", "must be -1 (unlimited) or more");
  if (!(hang_timeout_s >= 10 * step_s) && hang_timeout_s < 1) return bad("hang_timeout_s", "must be at least 1 s");
  if (hang_timeout_s <= 2 * step_s) {
    return bad("hang_timeout_s", "must exceed two steps (step_s): every healthy rank would be hung");
  }
  if (straggler_action != "report" && straggler_action != "evict") return bad("straggler_action", "must be report or evict");
  if (!(heartbeat_interval_s > 0)) return bad("heartbeat_interval_s", "must be above 0");
  if (missed_heartbeats < 1) return bad("missed_heartbeats", "must be 1 or more");
  if (rendezvous_timeout_s < 0) return bad("rendezvous_timeout_s", "must be 0 (automatic) or more");
  if (max_restarts < -1) return bad("max_restarts", "must be -1 (unlimited) or more");
  if (no_progress_restarts < 1) return bad("no_progress_restarts", "must be 1 or more");
  return Status::Ok();
}

}  // namespace trainguard
