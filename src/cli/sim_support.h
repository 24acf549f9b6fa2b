// What `trainguard sim` and `trainguard plan` share: finding a failure model
// by name, and the temporary SQLite stores of their runs, removed when the
// run ends and when the command is interrupted (SIGINT, SIGTERM).
#pragma once

#include <string>

#include "cli/commands.h"
#include "sim/failure_model.h"
#include "sim/sim_params.h"
#include "trainguard/status.h"

namespace trainguard {

// A shipped model by name (next to the binary, or installed), or a file.
StatusOr<FailureModel> ResolveFailureModel(const std::string& name);

// The command line's parameters over `params` (sim's --params file, or
// plan's defaults): the flags, --diagnose and --checkpoint-policy where
// given, and the model's GPUs per node where none is.
Status MergeSimFlags(const SimCommandOptions& o, const FailureModel& model, SimParams* params);

// A store path for one run, in the temporary directory; removed (with its
// -wal, -shm and -journal files) by the destructor, or by SIGINT/SIGTERM
// before the signal ends the process. One at a time.
class TemporarySimStore {
 public:
  explicit TemporarySimStore(int run);
  ~TemporarySimStore();
  TemporarySimStore(const TemporarySimStore&) = delete;
  TemporarySimStore& operator=(const TemporarySimStore&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace trainguard
