// Order statistics shared by the detectors, the diagnosis judge and reports.
#pragma once

#include <vector>

namespace trainguard {

// The median (the mean of the two middle values for an even count); 0 for
// none. Linear time: nth_element on the copy it takes.
double Median(std::vector<double> v);

}  // namespace trainguard
