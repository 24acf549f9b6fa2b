// trainguard._core: the client API for Python (trainguard/__init__.py wraps it).
#include <pybind11/pybind11.h>

#include "trainguard/client.h"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "trainguard client core (status page writer)";
  m.def("init", &trainguard::client::Init, "Attach to the agent's status page; False without one.");
  m.def("attached", &trainguard::client::Attached);
  m.def("step", &trainguard::client::Step, py::arg("step"));
  m.def("set_phase", [](const std::string& name) { trainguard::client::SetPhase(name.c_str()); },
        py::arg("name"));
  m.def("checkpoint_committed", &trainguard::client::CheckpointCommitted, py::arg("step"));
  m.def("shutdown", &trainguard::client::Shutdown);
}
