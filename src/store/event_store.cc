// Which store a `--store` names: a PostgreSQL URL or a SQLite file.
#include "store/event_store.h"

namespace trainguard {

StatusOr<std::unique_ptr<EventStore>> OpenEventStore(const std::string& where) {
  if (where.empty()) return InvalidArgument("no store given (--store PATH or postgresql://...)");
  if (IsPostgresUrl(where)) return OpenPostgresEventStore(where);
  return OpenSqliteEventStore(where);
}

}  // namespace trainguard
