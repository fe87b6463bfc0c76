//! The key expression: the template's literal text and placeholders, checked against the
//! function's parameters and rendered by the runtime's `KeyBuilder`.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, LitStr, Pat, Signature};

use crate::template::{self, Segment};

/// A parameter a placeholder may name.
pub(crate) enum Param {
    /// `name: Type` or the receiver; `type_span` is where a `Display` error is shown, and
    /// `name_span` where the name resolves (a parameter named by a `macro_rules!` caller
    /// resolves in that caller's context, not in the type's).
    Named {
        name: Ident,
        name_span: Span,
        type_span: Span,
    },
    /// A name bound inside a destructuring pattern, which placeholders may not use.
    InPattern { name: Ident, pattern_span: Span },
}

impl Param {
    /// The name the parameter binds, as the body would write it.
    pub(crate) fn name(&self) -> &Ident {
        match self {
            Param::Named { name, .. } | Param::InPattern { name, .. } => name,
        }
    }
}

pub(crate) fn params(sig: &Signature) -> Vec<Param> {
    let mut params = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => params.push(Param::Named {
                name: Ident::new("self", receiver.self_token.span),
                name_span: receiver.self_token.span,
                type_span: if receiver.colon_token.is_some() {
                    receiver.ty.span()
                } else {
                    receiver.span()
                },
            }),
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(ident) if ident.subpat.is_none() => params.push(Param::Named {
                    name: ident.ident.clone(),
                    name_span: ident.ident.span(),
                    type_span: typed.ty.span(),
                }),
                pattern => pattern_bindings(pattern, &mut |ident| {
                    params.push(Param::InPattern {
                        name: ident.clone(),
                        pattern_span: typed.pat.span(),
                    })
                }),
            },
        }
    }
    params
}

/// Calls `found` for every name a destructuring pattern binds.
fn pattern_bindings(pattern: &Pat, found: &mut dyn FnMut(&Ident)) {
    match pattern {
        Pat::Ident(p) => {
            found(&p.ident);
            if let Some((_, sub)) = &p.subpat {
                pattern_bindings(sub, found);
            }
        }
        Pat::Tuple(p) => p.elems.iter().for_each(|e| pattern_bindings(e, found)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| pattern_bindings(e, found)),
        Pat::Struct(p) => p
            .fields
            .iter()
            .for_each(|f| pattern_bindings(&f.pat, found)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| pattern_bindings(e, found)),
        Pat::Reference(p) => pattern_bindings(&p.pat, found),
        Pat::Paren(p) => pattern_bindings(&p.pat, found),
        Pat::Type(p) => pattern_bindings(&p.pat, found),
        _ => {}
    }
}

/// The key's expression, and the parameters its placeholders name.
pub(crate) struct Key {
    pub expr: TokenStream,
    pub roots: Vec<String>,
}

/// The expression that renders the key: literals pushed as written, each placeholder's value
/// pushed through `Display` with percent-encoding.
///
/// The spans are chosen for the compiler's errors: the `Display` requirement is spanned on the
/// parameter's type, so a wrong type is reported where it is declared; the fields of a
/// placeholder's path on the key, so a misspelt field is reported in the template that spells
/// it. The fields carry the expansion's hygiene, which keeps the compiler from offering to
/// replace the whole key with a field name.
pub(crate) fn render(
    lit: &LitStr,
    krate: &syn::Path,
    sig: &Signature,
    builder: &Ident,
) -> syn::Result<Key> {
    let segments = template::parse(&lit.value()).map_err(|msg| syn::Error::new(lit.span(), msg))?;
    let params = params(sig);
    let field_span = Span::call_site().located_at(lit.span());
    let mut pushes = Vec::new();
    let mut capacity = 0usize;
    let mut roots = Vec::new();
    for segment in &segments {
        match segment {
            Segment::Literal(text) => {
                capacity += text.len();
                pushes.push(quote!(#builder.push_literal(#text);));
            }
            Segment::Placeholder { root, path } => {
                capacity += 16;
                let type_span = find_param(&params, root, lit.span(), sig)?;
                roots.push(root.clone());
                let root_tokens = if root == "self" {
                    quote_spanned!(type_span=> self)
                } else {
                    Ident::new(root, type_span).into_token_stream()
                };
                let fields = path.iter().map(|field| match field.parse::<u32>() {
                    Ok(index) => syn::Index {
                        index,
                        span: field_span,
                    }
                    .into_token_stream(),
                    Err(_) => Ident::new(field, field_span).into_token_stream(),
                });
                pushes.push(quote_spanned! {type_span=>
                    #krate::__private::KeyBuilder::push_display(&mut #builder, &#root_tokens #(.#fields)*);
                });
            }
        }
    }
    let expr = quote! {{
        let mut #builder = #krate::__private::KeyBuilder::with_capacity(#capacity);
        #(#pushes)*
        #builder.finish()
    }};
    Ok(Key { expr, roots })
}

fn find_param(params: &[Param], root: &str, key_span: Span, sig: &Signature) -> syn::Result<Span> {
    for param in params {
        match param {
            Param::Named {
                name,
                name_span,
                type_span,
            } if name == root => return Ok(type_span.resolved_at(*name_span)),
            Param::InPattern { name, pattern_span } if name == root => {
                let mut error = syn::Error::new(
                    *pattern_span,
                    format!(
                        "`{root}` is bound by a pattern; a placeholder needs a parameter with a plain name: \
                         write `param: Type` and use `<param.field>` in the key"
                    ),
                );
                error.combine(syn::Error::new(
                    key_span,
                    format!("placeholder `<{root}>` used here"),
                ));
                return Err(error);
            }
            _ => {}
        }
    }
    let names: Vec<String> = params
        .iter()
        .filter_map(|p| match p {
            Param::Named { name, .. } => Some(format!("`{name}`")),
            Param::InPattern { .. } => None,
        })
        .collect();
    let available = if names.is_empty() {
        format!("`{}` has no named parameters", sig.ident)
    } else {
        format!("parameters of `{}`: {}", sig.ident, names.join(", "))
    };
    Err(syn::Error::new(
        key_span,
        format!("placeholder `<{root}>` names no parameter; {available}"),
    ))
}
