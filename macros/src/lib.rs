#![warn(missing_docs)]
//! `#[nanhunt::instrument]`: each tensor operation of a function's body
//! becomes a recorded op — its site (file, line, column, the expression's
//! text), its kind (from the method, the function or the operator, as a
//! typed `OpKind`), the tensors it read and the tensor it made — while a
//! traced re-run is active on the thread; otherwise each op costs a
//! thread-local flag read. Use it through the `nanhunt` crate, which
//! re-exports it and holds the runtime it expands to.
//!
//! What is rewritten, and how (see [`ops`] for the tables):
//! - method calls whose name and arity are a candle tensor op
//!   (`x.log()`, `a.broadcast_div(&b)`, `x.sum_keepdim(1)`, ...);
//! - calls of candle-nn's functions (`ops::softmax(&x, D::Minus1)`, ...);
//! - the operators `+ - * /`.
//!
//! Whether an operand is a tensor is left to the type system: the runtime
//! observes a value through autoref specialization, so a value that is no
//! tensor (an `f64`, a module, a `Vec`) passes through untouched, and the
//! operation itself is the user's own expression, evaluated once, in the
//! same order. Nested items (functions, constants) and macro invocations
//! are left as they are.

mod ops;
mod rewrite;

use proc_macro::TokenStream;
use quote::quote;

/// Records every tensor op of the function's body while a traced re-run
/// is active (see the crate docs). Takes no arguments.
#[proc_macro_attribute]
pub fn instrument(attr: TokenStream, item: TokenStream) -> TokenStream {
    let attr = proc_macro2::TokenStream::from(attr);
    if !attr.is_empty() {
        return syn::Error::new_spanned(attr, "#[nanhunt::instrument] takes no arguments")
            .to_compile_error()
            .into();
    }
    let mut f: syn::ItemFn = match syn::parse(item) {
        Ok(f) => f,
        Err(e) => {
            let mut e = e;
            e.combine(syn::Error::new(
                proc_macro2::Span::call_site(),
                "#[nanhunt::instrument] goes on a function with a body",
            ));
            return e.to_compile_error().into();
        }
    };
    rewrite::function(&mut f);
    quote!(#f).into()
}
