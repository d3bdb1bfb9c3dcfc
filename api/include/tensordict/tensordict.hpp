#pragma once
//! The one header users include: the whole synchronous API of tensordict-cpp.
#include "tensordict/backends/json_value.hpp"
#include "tensordict/errors.hpp"
#include "tensordict/nested_key.hpp"
#include "tensordict/non_tensor.hpp"
#include "tensordict/options.hpp"
#include "tensordict/tensor_dict.hpp"
#include "tensordict/config.hpp"
#include "tensordict/engine.hpp"
#include "tensordict/map.hpp"
#include "tensordict/store.hpp"
