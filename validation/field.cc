#include "validation/field.h"

namespace qknorm::validation {

const char* name(Field f) {
  switch (f) {
    case Field::kO:
      return "o";
    case Field::kLse:
      return "lse";
    case Field::kDq:
      return "dq";
    case Field::kDk:
      return "dk";
    case Field::kDv:
      return "dv";
    case Field::kDg:
    case Field::kScaleNormDg:
      return "dg";
    case Field::kY:
      return "y";
    case Field::kDx:
      return "dx";
    case Field::kDqWeight:
      return "dq_weight";
    case Field::kDkWeight:
      return "dk_weight";
    case Field::kDqBias:
      return "dq_bias";
    case Field::kDkBias:
      return "dk_bias";
  }
  return "?";
}

const char* name(Channel ch) {
  switch (ch) {
    case Channel::kMagnitude:
      return "magnitude";
    case Channel::kStoredOAbs:
      return "stored-O abs";
    case Channel::kSubnormalCount:
      return "subnormal count";
    case Channel::kStoredORel:
      return "stored-O rel";
    case Channel::kSoftmaxTerms:
      return "softmax terms";
    case Channel::kPResolution:
      return "P resolution";
    case Channel::kLayerShift:
      return "layer shift";
  }
  return "?";
}

}  // namespace qknorm::validation
