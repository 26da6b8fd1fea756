// Everything a training program needs to feed data: datasets, samplers, the DataLoader, transforms.
#pragma once

#include "colossal/data/auto_augment.h"       // AutoAugment and its uint8 ops
#include "colossal/data/batch.h"              // Batch, stack_collate, PinnedMemoryPool
#include "colossal/data/batch_stage.h"        // BatchStage
#include "colossal/data/cifar10.h"            // Cifar10Dataset
#include "colossal/data/data_loader.h"        // DataLoader
#include "colossal/data/dataset.h"            // Dataset, Example, TransformDataset
#include "colossal/data/image_batch_stage.h"  // ImageBatchStage
#include "colossal/data/mixup.h"              // Mixup, one_hot
#include "colossal/data/mnist.h"              // read_idx, MnistDataset, find_fashion_mnist
#include "colossal/data/random.h"             // derive_generator, Rng
#include "colossal/data/sampler.h"            // Sequential/Random/DistributedSampler
#include "colossal/data/synthetic.h"          // SyntheticImageDataset, SyntheticPixelStage
#include "colossal/data/token_file.h"         // TokenFileDataset
#include "colossal/data/transforms.h"         // ToTensor, RandomCrop, flips, Resize, Normalize
