// Everything a program needs to compute with colossal tensors: core, autograd and every op.
#pragma once

#include "colossal/autograd/checkpoint.h"  // checkpoint
#include "colossal/autograd/engine.h"      // backward
#include "colossal/autograd/function.h"    // Function, apply, hooks
#include "colossal/autograd/grad_mode.h"   // NoGradGuard
#include "colossal/core/allocator.h"       // memory_stats
#include "colossal/core/cuda_device.h"     // cuda::is_available, streams, events
#include "colossal/core/random.h"          // Generator, rand, randn, manual_seed
#include "colossal/core/tensor.h"          // Tensor, factories
#include "colossal/ops/conv.h"             // conv2d, batch_norm2d, pooling
#include "colossal/ops/elementwise.h"      // arithmetic, activations, comparisons
#include "colossal/ops/indexing.h"         // cat, stack, split, gather, where, ...
#include "colossal/ops/linalg.h"           // matmul, bmm, linear
#include "colossal/ops/nn_functional.h"    // softmax, layer_norm, cross_entropy, attention, ...
#include "colossal/ops/reduction.h"        // sum, mean, max, var
#include "colossal/ops/shape.h"            // view, reshape, permute, ...
