//! Which calls and operators are tensor ops, and of which kind: candle's
//! `Tensor` methods by name and number of arguments (so that an
//! iterator's `sum()` or an `f64`'s `max(y)` with another arity is left
//! alone), candle-nn's functions by their last path segment, and the
//! arithmetic operators. The kind is a variant of `nanhunt::OpKind`.

/// A `Tensor` method: its name, the numbers of arguments it takes, its kind.
const METHODS: &[(&str, &[usize], &str)] = &[
    ("log", &[0], "Log"),
    ("exp", &[0], "Exp"),
    ("sqrt", &[0], "Sqrt"),
    ("powf", &[1], "Pow"),
    ("pow", &[1], "Pow"),
    ("recip", &[0], "Div"),
    ("div", &[1], "Div"),
    ("broadcast_div", &[1], "Div"),
    ("mul", &[1], "Mul"),
    ("broadcast_mul", &[1], "Mul"),
    ("sqr", &[0], "Mul"),
    ("affine", &[2], "Mul"),
    ("add", &[1], "Add"),
    ("broadcast_add", &[1], "Add"),
    ("sub", &[1], "Sub"),
    ("broadcast_sub", &[1], "Sub"),
    ("neg", &[0], "Neg"),
    ("abs", &[0], "Abs"),
    ("sum", &[1], "Reduce"),
    ("sum_keepdim", &[1], "Reduce"),
    ("sum_all", &[0], "Reduce"),
    ("mean", &[1], "Reduce"),
    ("mean_keepdim", &[1], "Reduce"),
    ("mean_all", &[0], "Reduce"),
    ("cumsum", &[1], "Reduce"),
    ("log_sum_exp", &[1], "Reduce"),
    ("var", &[1], "Variance"),
    ("var_keepdim", &[1], "Variance"),
    ("max", &[1], "Extremum"),
    ("min", &[1], "Extremum"),
    ("max_keepdim", &[1], "Extremum"),
    ("min_keepdim", &[1], "Extremum"),
    ("matmul", &[1], "Matmul"),
    ("broadcast_matmul", &[1], "Matmul"),
    ("to_dtype", &[1], "Cast"),
    ("maximum", &[1], "Clamp"),
    ("minimum", &[1], "Clamp"),
    ("broadcast_maximum", &[1], "Clamp"),
    ("broadcast_minimum", &[1], "Clamp"),
    ("clamp", &[2], "Clamp"),
    ("where_cond", &[2], "Select"),
    ("eq", &[1], "Compare"),
    ("ne", &[1], "Compare"),
    ("lt", &[1], "Compare"),
    ("le", &[1], "Compare"),
    ("gt", &[1], "Compare"),
    ("ge", &[1], "Compare"),
    ("relu", &[0], "Activation"),
    ("gelu", &[0], "Activation"),
    ("gelu_erf", &[0], "Activation"),
    ("silu", &[0], "Activation"),
    ("tanh", &[0], "Activation"),
    ("elu", &[1], "Activation"),
    ("erf", &[0], "Activation"),
    ("max_pool2d", &[1], "Pool"),
    ("avg_pool2d", &[1], "Pool"),
    ("conv1d", &[5, 6], "Conv"),
    ("conv2d", &[5], "Conv"),
    ("forward", &[1], "Layer"),
    ("reshape", &[1], "View"),
    ("narrow", &[3], "View"),
    ("transpose", &[2], "View"),
    ("t", &[0], "View"),
    ("permute", &[1], "View"),
    ("squeeze", &[1], "View"),
    ("unsqueeze", &[1], "View"),
    ("flatten", &[2], "View"),
    ("flatten_all", &[0], "View"),
    ("flatten_from", &[1], "View"),
    ("broadcast_as", &[1], "View"),
    ("broadcast_left", &[1], "View"),
    ("expand", &[1], "View"),
    ("contiguous", &[0], "View"),
    ("index_select", &[2], "View"),
    ("gather", &[2], "View"),
    ("i", &[1], "View"),
];

/// A candle-nn function (or an associated function of `Tensor`): the last
/// segment of its path, its numbers of arguments, its kind.
const FUNCTIONS: &[(&str, &[usize], &str)] = &[
    ("softmax", &[2], "Softmax"),
    ("softmax_last_dim", &[1], "Softmax"),
    ("log_softmax", &[2], "LogSoftmax"),
    ("sigmoid", &[1], "Sigmoid"),
    ("silu", &[1], "Activation"),
    ("swiglu", &[1], "Activation"),
    ("leaky_relu", &[2], "Activation"),
    ("rms_norm", &[3], "Norm"),
    ("layer_norm", &[4], "Norm"),
    ("cross_entropy", &[2], "Loss"),
    ("nll", &[2], "Loss"),
    ("mse", &[2], "Loss"),
    ("binary_cross_entropy_with_logit", &[2], "Loss"),
    ("cat", &[2], "View"),
    ("stack", &[2], "View"),
];

fn find(table: &[(&str, &[usize], &'static str)], name: &str, args: usize) -> Option<&'static str> {
    table
        .iter()
        .find(|(n, arity, _)| *n == name && arity.contains(&args))
        .map(|&(_, _, kind)| kind)
}

/// The kind of `recv.name(args…)`, if it is a tensor op.
pub fn method(name: &str, args: usize) -> Option<&'static str> {
    find(METHODS, name, args)
}

/// The kind of a call of the function whose path ends in `name`.
pub fn function(name: &str, args: usize) -> Option<&'static str> {
    find(FUNCTIONS, name, args)
}

/// The kind of an arithmetic operator.
pub fn operator(op: &syn::BinOp) -> Option<(&'static str, &'static str)> {
    Some(match op {
        syn::BinOp::Add(_) => ("Add", "+"),
        syn::BinOp::Sub(_) => ("Sub", "-"),
        syn::BinOp::Mul(_) => ("Mul", "*"),
        syn::BinOp::Div(_) => ("Div", "/"),
        _ => return None,
    })
}
