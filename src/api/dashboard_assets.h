// The dashboard's files (web/dashboard), built into the binary so that the
// page works with no internet and nothing installed beside trainguard.
#pragma once

#include <cstddef>
#include <vector>

namespace trainguard {

struct DashboardAsset {
  const char* path;          // "/index.html", "/dashboard.js", ...
  const char* content_type;
  const unsigned char* data;
  std::size_t size;
};

const std::vector<DashboardAsset>& DashboardAssets();

}  // namespace trainguard
