#include "validation/field.h"

#include "qknorm/name_table.h"

namespace qknorm::validation {
namespace {

constexpr NamedValue<Field> kFieldNames[] = {
    {Field::kO, "o"},
    {Field::kLse, "lse"},
    {Field::kDq, "dq"},
    {Field::kDk, "dk"},
    {Field::kDv, "dv"},
    {Field::kDg, "dg"},
    {Field::kScaleNormDg, "dg"},
    {Field::kY, "y"},
    {Field::kDx, "dx"},
    {Field::kDqWeight, "dq_weight"},
    {Field::kDkWeight, "dk_weight"},
    {Field::kDqBias, "dq_bias"},
    {Field::kDkBias, "dk_bias"},
    {Field::kDSinks, "d_sinks"},
};

constexpr NamedValue<Channel> kChannelNames[] = {
    {Channel::kMagnitude, "magnitude"},
    {Channel::kStoredOAbs, "stored-O abs"},
    {Channel::kSubnormalCount, "subnormal count"},
    {Channel::kStoredORel, "stored-O rel"},
    {Channel::kSoftmaxTerms, "softmax terms"},
    {Channel::kPResolution, "P resolution"},
    {Channel::kLayerShift, "layer shift"},
    {Channel::kRoundingFlip, "rounding flip"},
};

}  // namespace

const char* name(Field f) { return name_in(kFieldNames, f); }

const char* name(Channel ch) { return name_in(kChannelNames, ch); }

}  // namespace qknorm::validation
