//! `#[rank_histogram(board = "...", score = "...", order, precision, layout,
//! histogram)]`: ranks of the model's scores on boards. The runtime's
//! `rank_histogram` module holds the pattern; this checks the options,
//! infers the board and the score when the struct leaves one choice, and
//! wires the two fields.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Attribute, DeriveInput, Expr, ExprLit, ExprUnary, Ident, Lit, LitStr, Meta, Type, UnOp};

use crate::ast::{Field, Input, Order};
use crate::attr::{self, Opt};
use crate::ctxt::Ctxt;
use crate::private::Private;

mod infer;

use infer::{infer, is_one_of, Other, BOARD_KIND, FLOATS, INTEGERS, SCORE_KIND};

const RANK: &str = "rank_histogram";
const BOARD: &str = "board";
const SCORE: &str = "score";
const ORDER: &str = "order";
const PRECISION: &str = "precision";
const LAYOUT: &str = "layout";
const HISTOGRAM: &str = "histogram";
const OPTIONS: &[&str] = &[BOARD, SCORE, ORDER, PRECISION, LAYOUT, HISTOGRAM];

/// How a histogram is stored, as `layout = "..."` spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Array,
    Documents,
}

impl Layout {
    const ALL: [Layout; 2] = [Layout::Array, Layout::Documents];

    fn spelling(self) -> &'static str {
        match self {
            Layout::Array => "array",
            Layout::Documents => "documents",
        }
    }
}

/// The variant's path under `__private`.
impl ToTokens for Layout {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        tokens.extend(match self {
            Layout::Array => quote!(Layout::Array),
            Layout::Documents => quote!(Layout::Documents),
        });
    }
}

/// What `#[rank_histogram]` says, as far as it could be read.
pub struct RankHistogram {
    /// The fields `board` and `score` name, found even when they cannot be
    /// used: after an error, the fallback keeps their types.
    named_board: Option<(Ident, Type)>,
    named_score: Option<Type>,
    /// The whole declaration; `None` after an error.
    spec: Option<Spec>,
}

struct Spec {
    board: (String, Ident, Type),
    score: (String, Ident, Type),
    order: Order,
    precision: Option<f64>,
    layout: Layout,
    histogram: String,
}

/// `#[rank_histogram]` as written.
struct Attr<'c> {
    board: Opt<'c, LitStr>,
    score: Opt<'c, LitStr>,
    order: Opt<'c, Order>,
    /// The number as written, sign included, and where.
    precision: Opt<'c, (Expr, f64)>,
    layout: Opt<'c, Layout>,
    histogram: Opt<'c, LitStr>,
}

/// Parses `#[rank_histogram]` if present; `collection` is the players'.
/// Errors go to `cx`.
pub fn parse(
    cx: &Ctxt,
    input: &DeriveInput,
    model: &Input,
    collection: &str,
) -> Option<RankHistogram> {
    let attrs = attr::single(cx, &input.attrs, RANK)?;
    let Some(attr) = attr(cx, attrs[0]) else {
        return Some(RankHistogram {
            named_board: None,
            named_score: None,
            spec: None,
        });
    };
    // The fields `board` and `score` name, even if they cannot be used.
    let named_board = attr
        .board
        .value()
        .and_then(|l| model.find(&l.value()))
        .map(|f| (f.ident.clone(), f.ty.clone()));
    let named_score = attr
        .score
        .value()
        .and_then(|l| model.find(&l.value()))
        .filter(|f| is_one_of(f.ty, INTEGERS) || is_one_of(f.ty, FLOATS))
        .map(|f| f.ty.clone());
    let spec = check(cx, attrs[0], attr, model, collection);
    Some(RankHistogram {
        named_board,
        named_score,
        spec,
    })
}

/// Reads `#[rank_histogram]`'s options; the bare form has none (it infers
/// everything). `None` for `#[rank_histogram = ...]`.
fn attr<'c>(cx: &'c Ctxt, first: &Attribute) -> Option<Attr<'c>> {
    if let Meta::NameValue(nv) = &first.meta {
        cx.error_spanned_by(
            nv,
            "`#[rank_histogram]` takes options in parentheses, as in `#[rank_histogram(board = \"examId\", score = \"score\")]`, or none",
        );
        return None;
    }
    let mut out = Attr {
        board: Opt::new(cx, RANK, BOARD),
        score: Opt::new(cx, RANK, SCORE),
        order: Opt::new(cx, RANK, ORDER),
        precision: Opt::new(cx, RANK, PRECISION),
        layout: Opt::new(cx, RANK, LAYOUT),
        histogram: Opt::new(cx, RANK, HISTOGRAM),
    };
    for opt in attr::read(cx, first) {
        match opt.name.as_str() {
            // board = "field"
            BOARD => {
                let lit = opt.lit_str(cx, RANK, "board = \"examId\"");
                out.board.take(&opt, lit);
            }
            // score = "field"
            SCORE => {
                let lit = opt.lit_str(cx, RANK, "score = \"score\"");
                out.score.take(&opt, lit);
            }
            // histogram = "name"
            HISTOGRAM => {
                let lit = opt.lit_str(cx, RANK, "histogram = \"exam_ranks\"");
                out.histogram.take(&opt, lit);
            }
            // order = "desc" | "asc"
            ORDER => {
                let Some(lit) = opt.lit_str(cx, RANK, "order = \"asc\"") else {
                    out.order.set_bad(&opt.path);
                    continue;
                };
                let other = lit.value();
                match Order::from_spelling(&other) {
                    Some(o) => out.order.set(&lit, o),
                    None => {
                        cx.error_spanned_by(
                            &lit,
                            format!(
                                "unknown `rank_histogram` order `{other}`; expected `desc` (a higher score ranks first, the default) or `asc` (a lower score ranks first, as for a race time){}",
                                attr::hint(&other, ["desc", "asc", "descending", "ascending"])
                            ),
                        );
                        out.order.set_bad(&lit);
                    }
                }
            }
            // layout = "array" | "documents"
            LAYOUT => {
                let Some(lit) = opt.lit_str(cx, RANK, "layout = \"documents\"") else {
                    out.layout.set_bad(&opt.path);
                    continue;
                };
                let other = lit.value();
                match Layout::ALL.into_iter().find(|l| l.spelling() == other) {
                    Some(l) => out.layout.set(&lit, l),
                    None => {
                        cx.error_spanned_by(
                            &lit,
                            format!(
                                "unknown `rank_histogram` layout `{other}`; expected `array` (one document per board, up to about 10,000 distinct scores) or `documents` (one document per board and score, for any number){}",
                                attr::hint(&other, Layout::ALL.map(Layout::spelling))
                            ),
                        );
                        out.layout.set_bad(&lit);
                    }
                }
            }
            // precision = 0.5
            PRECISION => {
                let Some(value) = opt.value(cx, RANK, "precision = 0.5") else {
                    out.precision.set_bad(&opt.path);
                    continue;
                };
                match precision_number(value) {
                    Ok(n) => out.precision.set(value, (value.clone(), n)),
                    Err(why) => {
                        cx.error_spanned_by(value, why);
                        out.precision.set_bad(value);
                    }
                }
            }
            _ => opt.unknown(cx, RANK, OPTIONS),
        }
    }
    Some(out)
}

/// Judges the attribute, rule by rule: the fields `board` and `score` name
/// (inferring those left out), the precision and the histogram collection.
fn check(
    cx: &Ctxt,
    first: &Attribute,
    attr: Attr,
    model: &Input,
    collection: &str,
) -> Option<Spec> {
    let precision = attr
        .precision
        .get()
        .and_then(|(_, (value, n))| check_precision(cx, &value, n));
    let board_given = attr.board.given();
    let score_given = attr.score.given();
    let board = attr.board.get().map(|(_, l)| l);
    let score = attr.score.get().map(|(_, l)| l);
    // `Some(None)`: given, but not a field that can be it (reported).
    let explicit_board = board_given.then(|| {
        board
            .as_ref()
            .and_then(|l| check_named(cx, model, l, BOARD))
    });
    let explicit_score = score_given.then(|| {
        score
            .as_ref()
            .and_then(|l| check_named(cx, model, l, SCORE))
    });
    if let (Some(Some(b)), Some(Some(s)), Some(lit)) = (&explicit_board, &explicit_score, &score) {
        check_two_fields(cx, b, s, lit)?;
    }
    let (board, score) = infer_left_out(cx, first, model, explicit_board, explicit_score);
    let histogram = match attr.histogram.get() {
        Some((_, lit)) => check_histogram(cx, &lit, collection),
        None => format!("{collection}_ranks"),
    };
    let field = |f: &Field| (f.bson_name.clone(), f.ident.clone(), f.ty.clone());
    Some(Spec {
        board: field(board?),
        score: field(score?),
        order: attr.order.get().map_or(Order::Desc, |(_, o)| o),
        precision,
        layout: attr.layout.get().map_or(Layout::Array, |(_, l)| l),
        histogram,
    })
}

/// `precision` is a step scores can be rounded to (see [`precision_value`]).
fn check_precision(cx: &Ctxt, value: &Expr, n: f64) -> Option<f64> {
    match precision_value(n) {
        Ok(p) => Some(p),
        Err(why) => {
            cx.error_spanned_by(value, why);
            None
        }
    }
}

/// `board` and `score` name fields of the model, neither stored as `_id`.
fn check_named<'m>(
    cx: &Ctxt,
    model: &'m Input,
    lit: &LitStr,
    option: &str,
) -> Option<&'m Field<'m>> {
    let f = model.resolve(cx, lit, RANK, option)?;
    if f.bson_name == "_id" {
        let why = if option == BOARD {
            "each player's document has its own `_id`, so every board would hold one player; name the field players share, such as an exam"
        } else {
            "a document's `_id` identifies it; name the field that holds the score"
        };
        let named = match lit.value() {
            v if v == "_id" => "`_id`".to_owned(),
            v => format!("`{v}` (stored as `_id`)"),
        };
        cx.error_spanned_by(
            lit,
            format!("`rank_histogram` option `{option}` names {named}: {why}"),
        );
        return None;
    }
    Some(f)
}

/// `board` and `score` (written at `lit`) name two fields.
fn check_two_fields(cx: &Ctxt, board: &Field, score: &Field, lit: &LitStr) -> Option<()> {
    if board.bson_name == score.bson_name {
        cx.error_spanned_by(
            lit,
            format!("`rank_histogram` options `board` and `score` both name `{}`; the board groups players and the score ranks them, so they are two fields", board.bson_name),
        );
        return None;
    }
    Some(())
}

/// A field left out is the one candidate of its kind (the score first,
/// then the board): the board and the score, each `None` when it could
/// not be found (reported).
fn infer_left_out<'m>(
    cx: &Ctxt,
    first: &Attribute,
    model: &'m Input,
    explicit_board: Option<Option<&'m Field<'m>>>,
    explicit_score: Option<Option<&'m Field<'m>>>,
) -> (Option<&'m Field<'m>>, Option<&'m Field<'m>>) {
    let score = match explicit_score {
        Some(s) => s,
        None => {
            let board = match explicit_board {
                None => Other::Open,
                Some(Some(b)) => Other::Is(b),
                Some(None) => Other::Failed,
            };
            infer(cx, first, model, &SCORE_KIND, &BOARD_KIND, board)
        }
    };
    let board = match explicit_board {
        Some(b) => b,
        None => {
            let score = score.map_or(Other::Failed, Other::Is);
            infer(cx, first, model, &BOARD_KIND, &SCORE_KIND, score)
        }
    };
    (board, score)
}

/// `histogram` names a valid collection other than the players'. Reported,
/// it is kept as written.
fn check_histogram(cx: &Ctxt, lit: &LitStr, collection: &str) -> String {
    let name = lit.value();
    if let Some(why) = attr::bad_collection_name(&name) {
        cx.error_spanned_by(lit, format!("invalid collection name: {why}"));
    } else if name == collection {
        cx.error_spanned_by(
            lit,
            format!("`rank_histogram` option `histogram` names `{name}`, the collection of the players' documents; the histograms need a collection of their own"),
        );
    }
    name
}

/// `precision = 0.5`: a number literal, negative ones included (they are
/// judged by [`precision_value`]).
fn precision_number(value: &Expr) -> Result<f64, String> {
    let not_a_number = || {
        "`rank_histogram` option `precision` takes a number literal, as in `precision = 0.5`"
            .to_owned()
    };
    let (negative, lit) = match value {
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_),
            expr,
            ..
        }) => (true, &**expr),
        other => (false, other),
    };
    let n = match lit {
        Expr::Lit(ExprLit {
            lit: Lit::Float(f), ..
        }) => f.base10_parse::<f64>().map_err(|_| not_a_number())?,
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => i.base10_parse::<f64>().map_err(|_| not_a_number())?,
        _ => return Err(not_a_number()),
    };
    Ok(if negative { -n } else { n })
}

/// The precision `p` is a step scores are rounded to: positive and finite.
fn precision_value(p: f64) -> Result<f64, String> {
    let positive = "`rank_histogram` option `precision` must be above 0: it is the step scores are rounded to, as in `precision = 0.5` or `precision = 0.01`";
    match p {
        p if p.is_finite() && p >= 1e-12 => Ok(p),
        p if p.is_finite() && p > 0.0 => Err(format!(
            "`rank_histogram` option `precision` = {p} is below 1e-12, finer than a double can tell apart at typical scores; leave `precision` out to rank exact values"
        )),
        p if p.is_finite() => Err(positive.to_owned()),
        _ => Err("`rank_histogram` option `precision` must be a finite number".to_owned()),
    }
}

impl RankHistogram {
    pub fn expand(&self, input: &DeriveInput, p: &Private) -> Option<TokenStream> {
        let spec = self.spec.as_ref()?;
        let ident = &input.ident;
        let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
        let (board_name, board_ident, board_ty) = &spec.board;
        let (score_name, score_ident, score_ty) = &spec.score;
        let descending = spec.order.is_descending();
        let precision = match spec.precision {
            Some(v) => quote!(#p::core::option::Option::Some(#v)),
            None => quote!(#p::core::option::Option::None),
        };
        let layout = spec.layout;
        let histogram = &spec.histogram;
        let board_p = p.at(board_ty.span());
        let board_check = quote_spanned! {board_ty.span()=>
            #board_p::assert_board_key::<#board_ty>();
        };
        let float_check = spec.precision.map(|_| {
            let p = p.at(score_ty.span());
            quote_spanned! {score_ty.span()=>
                #p::assert_float_score::<#score_ty>();
            }
        });
        // The associated types take the fields' spans, so that a bound they
        // miss is reported there once, and not again at the macro. `Score`'s
        // bound is `RankScore`, so it is the score's only type check: an
        // `assert_rank_score` as well would report the same error twice.
        let board_assoc = quote_spanned! {board_ty.span()=> type Board = #board_ty; };
        let score_assoc = quote_spanned! {score_ty.span()=> type Score = #score_ty; };
        Some(quote! {
            #[automatically_derived]
            impl #impl_g #p::RankHistogram for #ident #ty_g #where_g {
                #board_assoc
                #score_assoc
                const RANK: #p::RankSpec = #p::RankSpec {
                    board: #board_name,
                    score: #score_name,
                    descending: #descending,
                    precision: #precision,
                    layout: #p::#layout,
                    histogram: #histogram,
                };
                fn board(&self) -> &Self::Board {
                    &self.#board_ident
                }
                fn score(&self) -> Self::Score {
                    #p::core::clone::Clone::clone(&self.#score_ident)
                }
            }
            const _: () = {
                #[allow(dead_code)]
                fn __rank_fields #impl_g () #where_g { #board_check #float_check }
            };
        })
    }

    /// After an error in a `#[rank_histogram]` model, an impl that claims
    /// nothing, so that `Exam::ranks(&db)` elsewhere adds no error of its
    /// own. It keeps the types of the fields `board` and `score` name.
    pub fn fallback(&self, input: &DeriveInput, p: &Private) -> TokenStream {
        let (board_ty, board_ref) = match &self.named_board {
            Some((ident, ty)) => (quote!(#ty), quote!(&self.#ident)),
            None => (quote!(()), quote!(&())),
        };
        let score_ty = match &self.named_score {
            Some(ty) => quote!(#ty),
            None => quote!(f64),
        };
        let ident = &input.ident;
        let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
        quote! {
            #[automatically_derived]
            impl #impl_g #p::RankHistogram for #ident #ty_g #where_g {
                type Board = #board_ty;
                type Score = #score_ty;
                const RANK: #p::RankSpec = #p::RankSpec::FALLBACK;
                fn board(&self) -> &Self::Board {
                    #board_ref
                }
                fn score(&self) -> Self::Score {
                    #p::core::default::Default::default()
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
