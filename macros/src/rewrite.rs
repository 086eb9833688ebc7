//! The rewrite of a function body: every tensor op (see [`crate::ops`])
//! becomes a block that observes its operands, runs the user's own
//! expression once, and hands its result to the runtime, which records it
//! during a traced re-run and passes it through otherwise.
//!
//! Operands are evaluated once and in their order. A receiver or an
//! argument that is a place (`x`, `self.w`, `xs[i]`) is observed by a
//! shared borrow before the call, which then reads it as written (so an
//! auto-referenced `x.log()` does not move `x`); one that is a value (a
//! call, a `?`, a block) is bound by a `match`, whose scrutinee keeps its
//! temporaries alive as the statement did. An operator's operands are
//! moved into the `match`, as the operator moves them. Literals and
//! closures are passed as they are (their types are inferred from the
//! call), a literal number recorded as the scalar it is.

use crate::ops;
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{Expr, ExprBinary, ExprCall, ExprMethodCall, ItemFn};

/// Rewrites the body of `f` in place.
pub fn function(f: &mut ItemFn) {
    let in_impl = f
        .sig
        .inputs
        .iter()
        .any(|a| matches!(a, syn::FnArg::Receiver(_)));
    let mut r = Rewriter {
        function: f.sig.ident.to_string(),
        in_impl,
        next: 0,
        places: Vec::new(),
        texts: Vec::new(),
        bound: None,
        binding: String::new(),
    };
    r.visit_block_mut(&mut f.block);
    let stmts = &f.block.stmts;
    // The runtime's traits, in scope for the method-call dispatch of the
    // generated blocks (autoref specialization needs method syntax).
    f.block = syn::parse_quote!({
        #[allow(unused_imports)]
        use ::nanhunt::__private::{LookOther as _, LookTensor as _, MadeOther as _, MadeTensor as _};
        #(#stmts)*
    });
}

struct Rewriter {
    function: String,
    /// The function takes `self`: the owner's type is `Self`.
    in_impl: bool,
    /// A counter for the generated bindings' names.
    next: usize,
    /// Of the op being rewritten, which operands (receiver first) were
    /// places as written.
    places: Vec<bool>,
    /// Of the op being rewritten, each operand's text as written
    /// (receiver first): what a repair of the op rewrites.
    texts: Vec<String>,
    /// The expression a `let` binds to a name (compared by address: it is
    /// rewritten in place), and the name.
    bound: Option<(*const Expr, String)>,
    /// Of the op being rewritten, the name its statement binds its result
    /// to (`let h = x.exp()?;`), or empty: a repair elsewhere can name
    /// what it made.
    binding: String,
}

impl VisitMut for Rewriter {
    fn visit_expr_mut(&mut self, e: &mut Expr) {
        match e {
            // Constant contexts and token trees the rewrite cannot see into.
            Expr::Const(_) | Expr::Macro(_) => return,
            Expr::Repeat(r) => {
                self.visit_expr_mut(&mut r.expr);
                return;
            }
            _ => {}
        }
        // The op's text as written, and which operands are places, read
        // before the operands are rewritten.
        let text = op_kind(e).map(|_| tidy(&e.to_token_stream().to_string()));
        let binding = match &self.bound {
            Some((at, name)) if std::ptr::eq(*at, e) => name.clone(),
            _ => String::new(),
        };
        let places = operand_places(e);
        let texts = operand_texts(e);
        visit_mut::visit_expr_mut(self, e);
        let Some(text) = text else {
            return;
        };
        self.places = places;
        self.texts = texts;
        self.binding = binding;
        let rewritten = match e {
            Expr::MethodCall(m) => self.method(m, &text),
            Expr::Call(c) => self.call(c, &text),
            Expr::Binary(b) => self.binary(b, &text),
            _ => None,
        };
        if let Some(new) = rewritten {
            *e = new;
        }
    }

    // `let name = op?;`: the op's result is bound to `name`.
    fn visit_local_mut(&mut self, l: &mut syn::Local) {
        let name = match &l.pat {
            syn::Pat::Ident(p) => Some(p.ident.to_string()),
            syn::Pat::Type(t) => match &*t.pat {
                syn::Pat::Ident(p) => Some(p.ident.to_string()),
                _ => None,
            },
            _ => None,
        };
        let target = match (&l.init, name) {
            (Some(init), Some(name)) => Some((bound_op(&init.expr) as *const Expr, name)),
            _ => None,
        };
        let outer = std::mem::replace(&mut self.bound, target);
        visit_mut::visit_local_mut(self, l);
        self.bound = outer;
    }

    // Nested items are compiled on their own (and may be const contexts).
    fn visit_item_mut(&mut self, _: &mut syn::Item) {}

    // Types and generic arguments hold only constant expressions.
    fn visit_type_mut(&mut self, _: &mut syn::Type) {}

    fn visit_generic_argument_mut(&mut self, _: &mut syn::GenericArgument) {}
}

/// How an operand is observed and passed on.
enum Operand {
    /// A place read twice (borrowed to observe, then as written).
    Place(Expr),
    /// A value bound once by a `match` to this name, then passed as it.
    Bound(Expr, syn::Ident),
    /// Passed as written and not observed, with what is recorded of it.
    Passed(Expr, TokenStream),
}

impl Rewriter {
    fn fresh(&mut self, what: &str) -> syn::Ident {
        self.next += 1;
        format_ident!("__nh_{}{}", what, self.next)
    }

    fn method(&mut self, m: &ExprMethodCall, text: &str) -> Option<Expr> {
        let name = m.method.to_string();
        let kind = ops::method(&name, m.args.len())?;
        let receiver = self.operand(&m.receiver, true, 0);
        let args: Vec<Operand> = m
            .args
            .iter()
            .enumerate()
            .map(|(k, a)| self.operand(a, false, k + 1))
            .collect();
        let recv = receiver.as_receiver();
        let passed = args.iter().map(Operand::passed);
        let method = &m.method;
        let turbofish = &m.turbofish;
        let call = quote_spanned!(m.method.span()=> #recv.#method #turbofish (#(#passed),*));
        let mut operands = vec![receiver];
        operands.extend(args);
        Some(self.op(kind, &name, m.method.span(), text, operands, call))
    }

    fn call(&mut self, c: &ExprCall, text: &str) -> Option<Expr> {
        let Expr::Path(p) = &*c.func else {
            return None;
        };
        let last = p.path.segments.last()?;
        let name = last.ident.to_string();
        let kind = ops::function(&name, c.args.len())?;
        let args: Vec<Operand> = c
            .args
            .iter()
            .enumerate()
            .map(|(k, a)| self.operand(a, false, k))
            .collect();
        let passed = args.iter().map(Operand::passed);
        let func = &c.func;
        let call = quote_spanned!(last.ident.span()=> #func(#(#passed),*));
        Some(self.op(kind, &name, last.ident.span(), text, args, call))
    }

    fn binary(&mut self, b: &ExprBinary, text: &str) -> Option<Expr> {
        let (kind, symbol) = ops::operator(&b.op)?;
        // An operator moves its operands: both are values to it.
        let l = self.value(&b.left);
        let r = self.value(&b.right);
        let (lp, rp, op) = (l.passed(), r.passed(), &b.op);
        let call = quote_spanned!(b.op.span()=> #lp #op #rp);
        Some(self.op(kind, symbol, b.op.span(), text, vec![l, r], call))
    }

    /// How a method's receiver or argument is taken.
    /// How operand `at` (0: a method's receiver, or a function's first
    /// argument) is taken; whether it was a place is read from the code as
    /// written (its rewritten form may hold generated blocks).
    fn operand(&mut self, e: &Expr, receiver: bool, at: usize) -> Operand {
        if let Some(scalar) = literal(e) {
            return Operand::Passed(e.clone(), scalar);
        }
        let place = self.places.get(at).copied().unwrap_or(false);
        if place {
            return Operand::Place(e.clone());
        }
        match e {
            // A reference to a value is bound (the borrow of a temporary
            // lives as long as the statement's would).
            Expr::Reference(r) if r.mutability.is_none() && tensor_like(&r.expr) => {
                Operand::Bound(e.clone(), self.fresh("a"))
            }
            _ if receiver || tensor_like(e) => Operand::Bound(e.clone(), self.fresh("a")),
            _ => Operand::Passed(e.clone(), quote!(::core::option::Option::None)),
        }
    }

    /// An operator's operand: moved into the `match` unless a literal.
    fn value(&mut self, e: &Expr) -> Operand {
        match literal(e) {
            Some(scalar) => Operand::Passed(e.clone(), scalar),
            None => Operand::Bound(e.clone(), self.fresh("a")),
        }
    }

    /// The block that observes `operands`, evaluates `call` and hands its
    /// result to the runtime with the op's site.
    fn op(
        &mut self,
        kind: &str,
        name: &str,
        at: Span,
        text: &str,
        operands: Vec<Operand>,
        call: TokenStream,
    ) -> Expr {
        let kind = format_ident!("{}", kind);
        let function = self.function.clone();
        let line = quote_spanned!(at=> ::core::line!());
        let column = quote_spanned!(at=> ::core::column!());
        let file = quote_spanned!(at=> ::core::file!());
        let owner = if self.in_impl {
            quote!(::core::option::Option::Some(
                ::core::any::type_name::<Self> as fn() -> &'static str
            ))
        } else {
            quote!(::core::option::Option::None)
        };
        let looks = operands.iter().map(Operand::look);
        let out = self.fresh("out");
        let site = format_ident!("__NH_SITE{}", self.next);
        let texts = &self.texts;
        let binding = std::mem::take(&mut self.binding);
        let mut body = quote! {
            let __nh_in = [#(#looks),*];
            let #out = #call;
            (&::nanhunt::__private::Made::new(#out)).made(&#site, __nh_in, #owner)
        };
        // Bind the values innermost-last, so they are evaluated in order.
        for o in operands.iter().rev() {
            if let Operand::Bound(e, name) = o {
                let e = unparenthesized(e);
                body = quote! {
                    match #e {
                        #[allow(unused_mut)]
                        mut #name => { #body }
                    }
                };
            }
        }
        syn::parse_quote! {
            {
                static #site: ::nanhunt::__private::Site = ::nanhunt::__private::Site {
                    file: #file,
                    line: #line,
                    column: #column,
                    text: #text,
                    operands: &[#(#texts),*],
                    op: #name,
                    function: #function,
                    kind: ::nanhunt::OpKind::#kind,
                    binding: #binding,
                };
                #body
            }
        }
    }
}

/// The expression whose value a `let` binds: `e` without its `?` and
/// parentheses (`x.exp()?` binds what `x.exp()` made).
fn bound_op(e: &Expr) -> &Expr {
    match e {
        Expr::Try(t) => bound_op(&t.expr),
        Expr::Paren(p) => bound_op(&p.expr),
        _ => e,
    }
}

/// The kind of op `e` is, if it is one.
fn op_kind(e: &Expr) -> Option<&'static str> {
    match e {
        Expr::MethodCall(m) => ops::method(&m.method.to_string(), m.args.len()),
        Expr::Call(c) => match &*c.func {
            Expr::Path(p) => {
                let last = p.path.segments.last()?;
                ops::function(&last.ident.to_string(), c.args.len())
            }
            _ => None,
        },
        Expr::Binary(b) => ops::operator(&b.op).map(|(kind, _)| kind),
        _ => None,
    }
}

impl Operand {
    /// The receiver of a method call, parenthesized where a method call
    /// would bind tighter than it (`&x`, `*x`).
    fn as_receiver(&self) -> TokenStream {
        let e = self.passed();
        match self {
            Operand::Place(Expr::Path(_) | Expr::Field(_) | Expr::Index(_) | Expr::Paren(_))
            | Operand::Bound(..) => e,
            _ => quote!((#e)),
        }
    }

    /// The expression passed to the op.
    fn passed(&self) -> TokenStream {
        match self {
            Operand::Place(e) | Operand::Passed(e, _) => e.to_token_stream(),
            Operand::Bound(_, name) => name.to_token_stream(),
        }
    }

    /// What is recorded of it: `Option<Seen>`.
    fn look(&self) -> TokenStream {
        match self {
            Operand::Place(e) => quote!((&::nanhunt::__private::Look(&#e)).look()),
            Operand::Bound(_, name) => quote!((&::nanhunt::__private::Look(&#name)).look()),
            Operand::Passed(_, recorded) => recorded.clone(),
        }
    }
}

/// `e` without its parentheses, as a `match` scrutinee needs none
/// (unless it is a struct literal).
fn unparenthesized(e: &Expr) -> &Expr {
    match e {
        Expr::Paren(p) if !matches!(&*p.expr, Expr::Struct(_)) => unparenthesized(&p.expr),
        _ => e,
    }
}

/// A place expression whose second evaluation reads the same thing: a
/// path, a field of one, an index of one by an expression without calls
/// (`xs[i]`, `states[self.layer + 1]`), a deref.
fn is_place(e: &Expr) -> bool {
    match e {
        Expr::Path(_) => true,
        Expr::Field(f) => is_place(&f.base),
        Expr::Index(i) => is_place(&i.expr) && without_calls(&i.index),
        Expr::Paren(p) => is_place(&p.expr),
        Expr::Unary(u) => matches!(u.op, syn::UnOp::Deref(_)) && is_place(&u.expr),
        _ => false,
    }
}

/// An operand that is a place, or a shared reference to one: read twice.
fn place_operand(e: &Expr) -> bool {
    match e {
        Expr::Reference(r) => r.mutability.is_none() && is_place(&r.expr),
        _ => is_place(e),
    }
}

/// Which operands of op `e` (receiver first) are places, as written.
fn operand_places(e: &Expr) -> Vec<bool> {
    match e {
        Expr::MethodCall(m) => std::iter::once(&*m.receiver)
            .chain(m.args.iter())
            .map(place_operand)
            .collect(),
        Expr::Call(c) => c.args.iter().map(place_operand).collect(),
        _ => Vec::new(),
    }
}

/// The text of each operand of op `e` (receiver first), as written.
fn operand_texts(e: &Expr) -> Vec<String> {
    let text = |e: &Expr| tidy(&e.to_token_stream().to_string());
    match e {
        Expr::MethodCall(m) => std::iter::once(&*m.receiver)
            .chain(m.args.iter())
            .map(text)
            .collect(),
        Expr::Call(c) => c.args.iter().map(text).collect(),
        Expr::Binary(b) => vec![text(&b.left), text(&b.right)],
        _ => Vec::new(),
    }
}

/// Whether evaluating `e` twice is harmless: no calls, method calls,
/// macros, assignments or blocks in it.
fn without_calls(e: &Expr) -> bool {
    struct Calls(bool);
    impl<'a> syn::visit::Visit<'a> for Calls {
        fn visit_expr(&mut self, e: &'a Expr) {
            match e {
                Expr::Call(_)
                | Expr::MethodCall(_)
                | Expr::Macro(_)
                | Expr::Assign(_)
                | Expr::Block(_)
                | Expr::Closure(_) => self.0 = true,
                _ => syn::visit::visit_expr(self, e),
            }
        }
    }
    let mut c = Calls(false);
    syn::visit::Visit::visit_expr(&mut c, e);
    !c.0
}

/// An argument that may hold a tensor made on the spot (a `?`, a call, a
/// method call, a block): bound and observed. Anything else that is no
/// place (a tuple of dims, a closure, an array, a cast) is passed as it
/// is, so that its type is still inferred from the call.
fn tensor_like(e: &Expr) -> bool {
    match e {
        Expr::Try(_) | Expr::MethodCall(_) | Expr::Block(_) | Expr::Binary(_) => true,
        Expr::Call(c) => {
            !matches!(&*c.func, Expr::Path(p) if p.path.segments.len() == 1 && p.path.segments[0].ident.to_string().starts_with(char::is_uppercase))
        }
        Expr::Paren(p) => tensor_like(&p.expr),
        _ => false,
    }
}

/// A number written as a literal (or its negation): passed as written and
/// recorded as the scalar it is.
fn literal(e: &Expr) -> Option<TokenStream> {
    let (negative, lit) = match e {
        Expr::Lit(l) => (false, &l.lit),
        Expr::Unary(u) if matches!(u.op, syn::UnOp::Neg(_)) => match &*u.expr {
            Expr::Lit(l) => (true, &l.lit),
            _ => return None,
        },
        Expr::Paren(p) => return literal(&p.expr),
        _ => return None,
    };
    let value: f64 = match lit {
        syn::Lit::Float(f) => f.base10_parse().ok()?,
        // An integer is a dimension, an index or a count to a tensor op,
        // not a value it computes with; any other literal is no number.
        _ => return Some(quote!(::core::option::Option::None)),
    };
    let value = if negative { -value } else { value };
    Some(quote!(::core::option::Option::Some(::nanhunt::__private::Seen::Scalar(#value))))
}

/// An expression's tokens as a person writes them: no spaces around `.`
/// and `::`, before `(`, `?`, `,` and `)`, or after `(` and `&`.
fn tidy(tokens: &str) -> String {
    let mut s = tokens.to_string();
    // A call's parenthesis follows its name; an operator's operand keeps
    // its space (`t * (a - b)`).
    let mut joined = String::with_capacity(s.len());
    let chars: Vec<char> = s.chars().collect();
    for (k, &c) in chars.iter().enumerate() {
        let call = c == ' '
            && chars.get(k + 1) == Some(&'(')
            && k > 0
            && (chars[k - 1].is_alphanumeric() || matches!(chars[k - 1], '_' | '!' | '>' | ')'));
        if !call {
            joined.push(c);
        }
    }
    s = joined;
    for (from, to) in [
        (" . ", "."),
        (" .", "."),
        (" :: ", "::"),
        (":: ", "::"),
        (" ::", "::"),
        ("( ", "("),
        (" )", ")"),
        (" ?", "?"),
        (" ,", ","),
        (" [", "["),
        ("[ ", "["),
        (" ]", "]"),
        ("& ", "&"),
        ("(- ", "(-"),
        (", - ", ", -"),
        ("= - ", "= -"),
        ("! (", "!("),
    ] {
        while s.contains(from) {
            s = s.replace(from, to);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::tidy;

    #[test]
    fn tidy_reads_as_written() {
        assert_eq!(
            tidy("candle_nn :: ops :: softmax (& z , D :: Minus1)"),
            "candle_nn::ops::softmax(&z, D::Minus1)"
        );
        assert_eq!(tidy("(h . sqr () ? + 1e-8) ?"), "(h.sqr()? + 1e-8)?");
        assert_eq!(tidy("x . broadcast_div (& rms)"), "x.broadcast_div(&rms)");
        assert_eq!(
            tidy("t * (t . log () ? - logp) ?"),
            "t * (t.log()? - logp)?"
        );
    }
}
