"""The tau2 `retail` domain: products, users and orders; cancel, modify, return and exchange orders.

Write semantics, following the domain policy (policy.md):

* `cancel_pending_order` (status 'pending' only; reason 'no longer needed' or 'ordered by mistake'): status
  becomes 'cancelled', the reason is recorded and every payment is refunded to its method (a refund entry in
  the payment history; gift cards get the money back immediately, other methods "in 5 to 7 business days").
* `modify_pending_order_address` / `modify_pending_order_payment` (status 'pending' only): the new address,
  or a switch to a single other payment method: a payment on the new method and a refund of the old one are
  recorded (gift cards are debited / credited at once; a gift card must cover the whole total).
* `modify_pending_order_items` (status 'pending' only): each listed item becomes an available variant of the
  same product; the price difference is paid with (or refunded to) the given method and recorded; status
  becomes 'pending (item modified)', after which the order cannot be cancelled or modified again.
* `return_delivered_order_items` / `exchange_delivered_order_items` (status 'delivered' only): status becomes
  'return requested' / 'exchange requested' and the items (and for an exchange the new items, the payment
  method and the price difference) are recorded; the money moves when the items come back, so no balance
  changes now. Refunds of a return go to the original payment method or to one of the user's gift cards.
* `modify_user_address` replaces the user's default address.

Policy rules the agent must check itself (authentication, one user per conversation, confirmation, a single
modify or exchange per order...) are not enforced by the tools; they refuse only what cannot be done at all.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Union

from orchestra_jax.tau2.tools import CalculateTool, ToolError, TransferTool, tool

CANCEL_REASONS = ("no longer needed", "ordered by mistake")


# --- records ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(kw_only=True)
class Variant:
  item_id: str
  options: dict[str, str]
  available: bool
  price: float


@dataclasses.dataclass(kw_only=True)
class Product:
  name: str
  product_id: str
  variants: dict[str, Variant]


@dataclasses.dataclass(kw_only=True)
class Name:
  first_name: str
  last_name: str


@dataclasses.dataclass(kw_only=True)
class Address:
  address1: str
  address2: str
  city: str
  country: str
  state: str
  zip: str


@dataclasses.dataclass(kw_only=True)
class CreditCard:
  source: Literal["credit_card"]
  id: str
  brand: str
  last_four: str


@dataclasses.dataclass(kw_only=True)
class Paypal:
  source: Literal["paypal"]
  id: str


@dataclasses.dataclass(kw_only=True)
class GiftCard:
  source: Literal["gift_card"]
  id: str
  balance: float


PaymentMethod = Union[CreditCard, Paypal, GiftCard]


@dataclasses.dataclass(kw_only=True)
class User:
  user_id: str
  name: Name
  address: Address
  email: str
  payment_methods: dict[str, PaymentMethod]
  orders: list[str]


@dataclasses.dataclass(kw_only=True)
class OrderItem:
  name: str
  product_id: str
  item_id: str
  price: float
  options: dict[str, str]


@dataclasses.dataclass(kw_only=True)
class Fulfillment:
  tracking_id: list[str]
  item_ids: list[str]


@dataclasses.dataclass(kw_only=True)
class Transaction:
  transaction_type: Literal["payment", "refund"]
  amount: float
  payment_method_id: str


@dataclasses.dataclass(kw_only=True)
class Order:
  order_id: str
  user_id: str
  address: Address
  items: list[OrderItem]
  status: str  # pending, processed, delivered, cancelled, pending (item modified), return/exchange requested
  fulfillments: list[Fulfillment]
  payment_history: list[Transaction]
  cancel_reason: str | None = None
  exchange_items: list[str] | None = None
  exchange_new_items: list[str] | None = None
  exchange_payment_method_id: str | None = None
  exchange_price_difference: float | None = None
  return_items: list[str] | None = None
  return_payment_method_id: str | None = None


TABLES = {"products": Product, "users": User, "orders": Order}


def _money(x: float) -> float:
  return round(x, 2)


# --- tools --------------------------------------------------------------------------------------------------
_ADDRESS_ARGS = {"address1": "The first line of the address, such as '123 Main St'.",
                 "address2": "The second line of the address, such as 'Apt 1' or ''.",
                 "city": "The city, such as 'San Francisco'.", "state": "The state, such as 'CA'.",
                 "country": "The country, such as 'USA'.", "zip": "The zip code, such as '12345'."}


class RetailTools(CalculateTool, TransferTool):
  """Tools of the retail domain."""

  # helpers
  def _user(self, user_id: str) -> User:
    user = self.db.get("users", user_id)
    if user is None:
      raise ToolError(f"User {user_id} not found")
    return user

  def _order(self, order_id: str) -> Order:
    order = self.db.get("orders", order_id)
    if order is None:
      raise ToolError(f"Order {order_id} not found")
    return order

  def _product(self, product_id: str) -> Product:
    product = self.db.get("products", product_id)
    if product is None:
      raise ToolError(f"Product {product_id} not found")
    return product

  def _payment_method(self, user_id: str, payment_method_id: str) -> PaymentMethod:
    method = self._user(user_id).payment_methods.get(payment_method_id)
    if method is None:
      raise ToolError(f"Payment method {payment_method_id} not found")
    return method

  def _credit_gift_card(self, user_id: str, payment_method_id: str, amount: float) -> None:
    card = self.db.edit("users", user_id).payment_methods[payment_method_id]
    card.balance = _money(card.balance + amount)

  def _check_items(self, order: Order, item_ids: list[str]) -> None:
    if not item_ids:
      raise ToolError("No items given")
    in_order = [item.item_id for item in order.items]
    for item_id in dict.fromkeys(item_ids):
      if item_ids.count(item_id) > in_order.count(item_id):
        raise ToolError(f"Number of {item_id} not found" if item_id in in_order
                        else f"Item {item_id} not found in order {order.order_id}")

  def _price_difference(self, order: Order, item_ids: list[str], new_item_ids: list[str]) -> tuple[float, list]:
    """Total new price minus old price, and the (item index, new variant) pairs (raises ToolError)."""
    if len(item_ids) != len(new_item_ids):
      raise ToolError("The number of items to be exchanged should match")
    self._check_items(order, item_ids)
    used: set[int] = set()
    changes, diff = [], 0.0
    for item_id, new_item_id in zip(item_ids, new_item_ids):
      index = next(i for i, item in enumerate(order.items) if item.item_id == item_id and i not in used)
      used.add(index)
      item = order.items[index]
      variant = self._product(item.product_id).variants.get(new_item_id)
      if variant is None or not variant.available:
        raise ToolError(f"New item {new_item_id} not found or available")
      diff += variant.price - item.price
      changes.append((index, variant))
    return _money(diff), changes

  # read tools
  @tool("Find the user id by email. If the user is not found, the function returns an error message.",
        args={"email": "The email of the user, such as 'something@example.com'."})
  def find_user_id_by_email(self, email: str) -> str:
    for user in self.db.rows("users").values():
      if user.email.lower() == email.lower():
        return user.user_id
    raise ToolError("User not found")

  @tool("Find the user id by first name, last name, and zip code. If the user is not found, the function "
        "returns an error message. By default, find user id by email, and only call this function if the user "
        "is not found by email or cannot remember email.",
        args={"first_name": "The first name of the customer, such as 'John'.",
              "last_name": "The last name of the customer, such as 'Doe'.",
              "zip": "The zip code of the customer, such as '12345'."})
  def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
    for user in self.db.rows("users").values():
      if (user.name.first_name.lower() == first_name.lower() and user.name.last_name.lower() == last_name.lower()
          and user.address.zip == zip):
        return user.user_id
    raise ToolError("User not found")

  @tool("Get the details of an order.",
        args={"order_id": "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the "
                          "beginning of the order id."})
  def get_order_details(self, order_id: str) -> Order:
    return self._order(order_id)

  @tool("Get the inventory details of a product: its variants, their options, availability and price.",
        args={"product_id": "The product id, such as '6086499569'. Be careful the product id is different "
                            "from the item id."})
  def get_product_details(self, product_id: str) -> Product:
    return self._product(product_id)

  @tool("Get the details of a user, including their orders.",
        args={"user_id": "The user id, such as 'sara_doe_496'."})
  def get_user_details(self, user_id: str) -> User:
    return self._user(user_id)

  @tool("List the name and product id of all product types. Each product type has a variety of different "
        "items with unique item ids and options. There are only 50 product types in the store.")
  def list_all_product_types(self) -> dict[str, str]:
    products = self.db.rows("products").values()
    return {p.name: p.product_id for p in sorted(products, key=lambda p: p.name)}

  # write tools
  @tool("Cancel a pending order. If the order is already processed or delivered, it cannot be cancelled. The "
        "agent needs to explain the cancellation detail and ask for explicit user confirmation (yes/no) to "
        "proceed. If the user confirms, the order status will be changed to 'cancelled' and the payment will "
        "be refunded. The refund will be added to the user's gift card balance immediately if the payment "
        "was made using a gift card, otherwise the refund would take 5-7 business days to process.",
        writes=True,
        args={"order_id": "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the "
                          "beginning of the order id.",
              "reason": "The reason for cancellation, which should be either 'no longer needed' or 'ordered "
                        "by mistake'."})
  def cancel_pending_order(self, order_id: str, reason: str) -> Order:
    order = self._order(order_id)
    if order.status != "pending":
      raise ToolError("Non-pending order cannot be cancelled")
    if reason not in CANCEL_REASONS:
      raise ToolError(f"Invalid reason: must be one of {', '.join(repr(r) for r in CANCEL_REASONS)}")
    for payment in order.payment_history:
      self._payment_method(order.user_id, payment.payment_method_id)
    order = self.db.edit("orders", order_id)
    refunds = []
    for payment in order.payment_history:
      refunds.append(Transaction(transaction_type="refund", amount=payment.amount,
                                 payment_method_id=payment.payment_method_id))
      if isinstance(self._payment_method(order.user_id, payment.payment_method_id), GiftCard):
        self._credit_gift_card(order.user_id, payment.payment_method_id, payment.amount)
    order.payment_history.extend(refunds)
    order.status = "cancelled"
    order.cancel_reason = reason
    return order

  @tool("Exchange items in a delivered order to new items of the same product type. For a delivered order, "
        "return or exchange can be only done once by the agent. The agent needs to explain the exchange detail "
        "and ask for explicit user confirmation (yes/no) to proceed.", writes=True,
        args={"order_id": "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the "
                          "beginning of the order id.",
              "item_ids": "The item ids to be exchanged, each such as '1008292230'. There could be duplicate "
                          "items in the list.",
              "new_item_ids": "The item ids to be exchanged for, each such as '1008292230'. There could be "
                              "duplicate items in the list. Each new item id should match the item id in the "
                              "same position and be of the same product.",
              "payment_method_id": "The payment method id to pay or receive refund for the item price "
                                   "difference, such as 'gift_card_0000000' or 'credit_card_0000000'. These can "
                                   "be looked up from the user or order details."})
  def exchange_delivered_order_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                     payment_method_id: str) -> Order:
    order = self._order(order_id)
    if order.status != "delivered":
      raise ToolError("Non-delivered order cannot be exchanged")
    diff, _ = self._price_difference(order, item_ids, new_item_ids)
    method = self._payment_method(order.user_id, payment_method_id)
    if isinstance(method, GiftCard) and method.balance < diff:
      raise ToolError("Insufficient gift card balance to pay for the price difference")
    order = self.db.edit("orders", order_id)
    order.status = "exchange requested"
    order.exchange_items = sorted(item_ids)
    order.exchange_new_items = sorted(new_item_ids)
    order.exchange_payment_method_id = payment_method_id
    order.exchange_price_difference = diff
    return order

  @tool("Modify the shipping address of a pending order. The agent needs to explain the modification detail "
        "and ask for explicit user confirmation (yes/no) to proceed.", writes=True,
        args={"order_id": "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the "
                          "beginning of the order id.", **_ADDRESS_ARGS})
  def modify_pending_order_address(self, order_id: str, address1: str, address2: str, city: str, state: str,
                                   country: str, zip: str) -> Order:
    order = self._order(order_id)
    if order.status != "pending":
      raise ToolError("Non-pending order cannot be modified")
    order = self.db.edit("orders", order_id)
    order.address = Address(address1=address1, address2=address2, city=city, country=country, state=state,
                            zip=zip)
    return order

  @tool("Modify items in a pending order to new items of the same product type. For a pending order, this "
        "function can only be called once. The agent needs to explain the exchange detail and ask for explicit "
        "user confirmation (yes/no) to proceed.", writes=True,
        args={"order_id": "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the "
                          "beginning of the order id.",
              "item_ids": "The item ids to be modified, each such as '1008292230'. There could be duplicate "
                          "items in the list.",
              "new_item_ids": "The item ids to be modified for, each such as '1008292230'. There could be "
                              "duplicate items in the list. Each new item id should match the item id in the "
                              "same position and be of the same product.",
              "payment_method_id": "The payment method id to pay or receive refund for the item price "
                                   "difference, such as 'gift_card_0000000' or 'credit_card_0000000'. These can "
                                   "be looked up from the user or order details."})
  def modify_pending_order_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                 payment_method_id: str) -> Order:
    order = self._order(order_id)
    if order.status != "pending":
      raise ToolError("Non-pending order cannot be modified")
    diff, changes = self._price_difference(order, item_ids, new_item_ids)
    method = self._payment_method(order.user_id, payment_method_id)
    if isinstance(method, GiftCard) and method.balance < diff:
      raise ToolError("Insufficient gift card balance to pay for the price difference")
    order = self.db.edit("orders", order_id)
    order.payment_history.append(Transaction(transaction_type="payment" if diff > 0 else "refund",
                                             amount=abs(diff), payment_method_id=payment_method_id))
    if isinstance(method, GiftCard):
      self._credit_gift_card(order.user_id, payment_method_id, -diff)
    for index, variant in changes:
      item = order.items[index]
      item.item_id = variant.item_id
      item.price = variant.price
      item.options = dict(variant.options)
    order.status = "pending (item modified)"
    return order

  @tool("Modify the payment method of a pending order. The agent needs to explain the modification detail and "
        "ask for explicit user confirmation (yes/no) to proceed.", writes=True,
        args={"order_id": "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the "
                          "beginning of the order id.",
              "payment_method_id": "The payment method id to pay the order, such as 'gift_card_0000000' or "
                                   "'credit_card_0000000'. These can be looked up from the user or order "
                                   "details."})
  def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> Order:
    order = self._order(order_id)
    if order.status != "pending":
      raise ToolError("Non-pending order cannot be modified")
    method = self._payment_method(order.user_id, payment_method_id)
    if len(order.payment_history) != 1 or order.payment_history[0].transaction_type != "payment":
      raise ToolError("There should be exactly one payment for a pending order")
    old = order.payment_history[0]
    if old.payment_method_id == payment_method_id:
      raise ToolError("The new payment method should be different from the current one")
    amount = old.amount
    if isinstance(method, GiftCard) and method.balance < amount:
      raise ToolError("Insufficient gift card balance to pay for the order")
    old_method = self._payment_method(order.user_id, old.payment_method_id)
    order = self.db.edit("orders", order_id)
    order.payment_history.extend([
      Transaction(transaction_type="payment", amount=amount, payment_method_id=payment_method_id),
      Transaction(transaction_type="refund", amount=amount, payment_method_id=old.payment_method_id)])
    if isinstance(method, GiftCard):
      self._credit_gift_card(order.user_id, payment_method_id, -amount)
    if isinstance(old_method, GiftCard):
      self._credit_gift_card(order.user_id, old.payment_method_id, amount)
    return order

  @tool("Modify the default address of a user. The agent needs to explain the modification detail and ask for "
        "explicit user confirmation (yes/no) to proceed.", writes=True,
        args={"user_id": "The user id, such as 'sara_doe_496'.", **_ADDRESS_ARGS})
  def modify_user_address(self, user_id: str, address1: str, address2: str, city: str, state: str, country: str,
                          zip: str) -> User:
    self._user(user_id)
    user = self.db.edit("users", user_id)
    user.address = Address(address1=address1, address2=address2, city=city, country=country, state=state,
                           zip=zip)
    return user

  @tool("Return some items of a delivered order. The order status will be changed to 'return requested'. The "
        "agent needs to explain the return detail and ask for explicit user confirmation (yes/no) to proceed. "
        "The user will receive follow-up email for how and where to return the item.", writes=True,
        args={"order_id": "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the "
                          "beginning of the order id.",
              "item_ids": "The item ids to be returned, each such as '1008292230'. There could be duplicate "
                          "items in the list.",
              "payment_method_id": "The payment method id to receive the refund, such as 'gift_card_0000000' or "
                                   "'credit_card_0000000'. It should be either the original payment method or "
                                   "a gift card of the user."})
  def return_delivered_order_items(self, order_id: str, item_ids: list[str], payment_method_id: str) -> Order:
    order = self._order(order_id)
    if order.status != "delivered":
      raise ToolError("Non-delivered order cannot be returned")
    method = self._payment_method(order.user_id, payment_method_id)
    original = order.payment_history[0].payment_method_id if order.payment_history else None
    if not isinstance(method, GiftCard) and payment_method_id != original:
      raise ToolError("Payment method should be either the original payment method or a gift card")
    self._check_items(order, item_ids)
    order = self.db.edit("orders", order_id)
    order.status = "return requested"
    order.return_items = sorted(item_ids)
    order.return_payment_method_id = payment_method_id
    return order
