#include "cli/cli_support.h"

#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <filesystem>

#include "cli/commands.h"

namespace trainguard {

namespace fs = std::filesystem;

std::string SelfExe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "trainguard";
  buf[n] = '\0';
  return buf;
}

// Where the Python package sits next to the binary (build tree or install).
std::string PythonDir() {
  fs::path exe = SelfExe();
  for (const fs::path& candidate :
       {exe.parent_path() / "python", exe.parent_path().parent_path() / "lib" / "trainguard" / "python"}) {
    if (fs::exists(candidate / "trainguard" / "__init__.py")) return candidate.string();
  }
  return "";
}

// The shipped attribution rules: next to the binary (build tree) or installed.
std::string DefaultRulesPath() {
  fs::path exe = SelfExe();
  for (const fs::path& candidate : {exe.parent_path() / "rules" / "attribution.json",
                                    exe.parent_path().parent_path() / "share" / "trainguard" /
                                        "rules" / "attribution.json"}) {
    if (fs::exists(candidate)) return candidate.string();
  }
  return "";
}

std::string DefaultJobId() {
  // Under Slurm the job is Slurm's: CLUSTER-JOBID (slurm-JOBID without a
  // cluster name), with -rN for its Nth requeue, which reruns the same id.
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  };
  const std::string slurm_job = env("SLURM_JOB_ID");
  if (!slurm_job.empty() && slurm_job.find_first_not_of("0123456789_") == std::string::npos) {
    std::string cluster = env("SLURM_CLUSTER_NAME");
    if (cluster.empty() || cluster.find_first_of(" /\\") != std::string::npos) cluster = "slurm";
    const std::string requeue = env("SLURM_RESTART_COUNT");
    return cluster + "-" + slurm_job + (requeue.empty() || requeue == "0" ? "" : "-r" + requeue);
  }
  // Elsewhere: the time, the pid and 16 random bits (two jobs starting in
  // the same second in PID namespaces of their own may share a pid).
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "job-%Y%m%d-%H%M%S", std::gmtime(&t));
  std::random_device random;
  char suffix[8];
  std::snprintf(suffix, sizeof(suffix), "%04x", static_cast<unsigned>(random() & 0xffff));
  return std::string(buf) + "-" + std::to_string(getpid()) + "-" + suffix;
}

std::string Hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

std::string DefaultRunDirBase() {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp != nullptr && *tmp == '/' ? tmp : "/tmp") + "/trainguard";
}

std::string DefaultStorePath() {
  fs::path dir;
  if (const char* state = std::getenv("XDG_STATE_HOME"); state != nullptr && *state == '/') {
    dir = fs::path(state) / "trainguard";
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/') {
    dir = fs::path(home) / ".local" / "state" / "trainguard";
  } else {
    dir = fs::path("/tmp") / ("trainguard-" + std::to_string(getuid()));
  }
  return (dir / "trainguard.db").string();
}

StatusOr<RuleSet> LoadRulesFor(const std::vector<std::string>& extra) {
  const char* env = std::getenv("TRAINGUARD_RULES");
  std::string path = env != nullptr && *env != '\0' ? env : DefaultRulesPath();
  if (path.empty()) return NotFound("the shipped rule file attribution.json was not found next to " + SelfExe());
  auto rules = RuleSet::Load(path);
  if (!rules.ok()) return rules.status();
  for (const auto& p : extra) {
    auto more = RuleSet::Load(p);
    if (!more.ok()) return more.status();
    rules->Merge(*more);
  }
  // The learned fallback: $TRAINGUARD_MODEL ("none": rules alone), else
  // attribution_model.json beside the rule file. A rule file without one
  // (an operator's own) attributes by its rules alone.
  const char* model_env = std::getenv("TRAINGUARD_MODEL");
  std::string model_path = model_env != nullptr && *model_env != '\0'
                               ? model_env
                               : (fs::path(path).parent_path() / "attribution_model.json").string();
  if (model_path == "none" || (model_env == nullptr && !fs::exists(model_path))) return rules;
  auto model = LogModel::Load(model_path);
  if (!model.ok()) return model.status();
  rules->set_model(std::make_shared<const LogModel>(std::move(*model)));
  return rules;
}

bool OpenJob(const EventsOptions& o, std::unique_ptr<EventStore>* store, std::string* job_id) {
  if (!IsPostgresUrl(o.store) && !fs::exists(o.store)) {
    std::fprintf(stderr, "trainguard: error: no store at %s (use --store PATH)\n", StoreDisplayName(o.store).c_str());
    return false;
  }
  auto opened = OpenEventStore(o.store);
  if (!opened.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", opened.status().message().c_str());
    return false;
  }
  *store = std::move(opened.value());
  *job_id = o.job_id;
  if (job_id->empty()) {
    auto jobs = (*store)->Jobs();
    if (!jobs.ok() || jobs->empty()) {
      std::fprintf(stderr, "trainguard: error: the store %s holds no jobs\n", StoreDisplayName(o.store).c_str());
      return false;
    }
    *job_id = jobs->back().job_id;
    return true;
  }
  auto jobs = (*store)->Jobs();
  if (!jobs.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", jobs.status().message().c_str());
    return false;
  }
  std::string newest;
  for (auto it = jobs->rbegin(); it != jobs->rend(); ++it) {
    if (it->job_id == *job_id) return true;
    if (it - jobs->rbegin() < 3) newest += (newest.empty() ? "" : ", ") + it->job_id;
  }
  std::fprintf(stderr, "trainguard: error: the store %s has no job %s (%s)\n", StoreDisplayName(o.store).c_str(),
               job_id->c_str(),
               newest.empty() ? "it holds no jobs" : ("its newest: " + newest).c_str());
  return false;
}


}  // namespace trainguard
