#include "controller/job_controller.h"

#include <gtest/gtest.h>
