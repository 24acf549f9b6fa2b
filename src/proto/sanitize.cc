#include "proto/sanitize.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include "common/utf8.h"

namespace trainguard {

using google::protobuf::FieldDescriptor;

int SanitizeStrings(google::protobuf::Message* msg) {
  int changed = 0;
  const google::protobuf::Descriptor* d = msg->GetDescriptor();
  const google::protobuf::Reflection* r = msg->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      if (f->is_repeated()) {
        for (int k = 0; k < r->FieldSize(*msg, f); ++k) {
          const std::string& s = r->GetRepeatedStringReference(*msg, f, k, nullptr);
          if (!IsValidUtf8(s)) r->SetRepeatedString(msg, f, k, ValidUtf8(s)), ++changed;
        }
      } else if (r->HasField(*msg, f) || !f->has_presence()) {
        std::string scratch;
        const std::string& s = r->GetStringReference(*msg, f, &scratch);
        if (!IsValidUtf8(s)) r->SetString(msg, f, ValidUtf8(s)), ++changed;
      }
    } else if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (f->is_map()) continue;  // maps of strings: keys and values are ours (env)
      if (f->is_repeated()) {
        for (int k = 0; k < r->FieldSize(*msg, f); ++k) {
          changed += SanitizeStrings(r->MutableRepeatedMessage(msg, f, k));
        }
      } else if (r->HasField(*msg, f)) {
        changed += SanitizeStrings(r->MutableMessage(msg, f));
      }
    }
  }
  return changed;
}

}  // namespace trainguard
